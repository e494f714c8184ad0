"""Checks over a whole apply set together with what is already stored: references, cycles,
capacities. Pure: the caller passes the stored specs in and gets problems back."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..yamldoc import format_path
from .kinds import KindInfo
from .pool import GLOBAL_POOL


class Candidate(Protocol):
    """An object offered for storing, and how to name a field of it in a message: a manifest
    names its file and line (manifests.Manifest), an object built by a verb only the field."""

    @property
    def kind(self) -> KindInfo: ...
    @property
    def name(self) -> str: ...
    @property
    def obj(self) -> Any: ...  # the kind's pydantic model
    @property
    def source(self) -> str: ...
    @property
    def line(self) -> int: ...
    def where(self, *path: str | int) -> str: ...


@dataclass(frozen=True)
class Built:
    """A candidate that comes from no file (`reconciler run`): messages name the field alone."""

    kind: KindInfo
    obj: Any
    source: str = "(command line)"
    line: int = 0

    @property
    def name(self) -> str:
        return str(self.obj.metadata.name)

    def where(self, *path: str | int) -> str:
        return format_path(path)


def _capacity(pool_spec: dict[str, Any] | None) -> int | None:
    if pool_spec is None:
        return None
    slots = pool_spec.get("slots", "unlimited")
    return None if slots == "unlimited" else int(slots)


def find_cycle(graph: dict[str, list[str]], starts: list[str]) -> list[str] | None:
    """A dependency cycle reachable from `starts`, as [a, b, ..., a], or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    for start in starts:
        if state.get(start):
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            node, index = stack.pop()
            if index == 0:
                state[node] = 1
                path.append(node)
            children = graph.get(node, [])
            if index < len(children):
                stack.append((node, index + 1))
                child = children[index]
                if state.get(child) == 1:
                    return [*path[path.index(child) :], child]
                if not state.get(child):
                    stack.append((child, 0))
            else:
                state[node] = 2
                path.pop()
    return None


def validate_apply(
    manifests: Sequence[Candidate],
    stored_jobs: dict[str, dict[str, Any]],
    stored_pools: dict[str, dict[str, Any]],
    refused: Collection[tuple[str, str]] = (),
) -> list[str]:
    """Problems of the apply set as `file:line: field: message`, empty when it may be stored.
    `refused`: (kind, name) of documents of the same apply refused earlier (their own
    problems are reported): a reference to one is not also called missing."""
    problems: list[str] = []
    seen: dict[tuple[str, str], Candidate] = {}
    for m in manifests:
        key = (m.kind.kind, m.name)
        if key in seen:
            problems.append(
                f"{m.where('metadata', 'name')}: duplicate {m.kind.kind} {m.name!r} in this apply "
                f"(first at {seen[key].source}:{seen[key].line})"
            )
        seen[key] = m

    pools = dict(stored_pools.items())
    pools.update({m.name: m.obj.spec.model_dump(by_alias=True) for m in manifests if m.kind.kind == "Pool"})
    new_jobs = {m.name: m for m in manifests if m.kind.kind == "Job"}
    # stored jobs as stored, unless this apply replaces them (their entries are set below)
    others = [(name, spec) for name, spec in stored_jobs.items() if name not in new_jobs]
    graph = {name: [d["job"] for d in spec.get("dependsOn", [])] for name, spec in others}
    job_slots = {name: (spec.get("pool"), spec.get("slots", 1)) for name, spec in others}
    global_cap = _capacity(pools.get(GLOBAL_POOL))

    for name, m in new_jobs.items():
        spec = m.obj.spec
        graph[name] = [d.job for d in spec.depends_on]
        job_slots[name] = (spec.pool, spec.slots)
        edges: dict[str, list[str]] = {}
        for i, dep in enumerate(spec.depends_on):
            if dep.job in edges and sorted(edges[dep.job]) != sorted(dep.outcomes):
                problems.append(
                    f"{m.where('spec', 'dependsOn', i)}: job {dep.job!r} is named twice with different outcomes"
                )
            edges.setdefault(dep.job, list(dep.outcomes))
            if dep.job == name:
                problems.append(f"{m.where('spec', 'dependsOn', i, 'job')}: a job cannot depend on itself")
            elif dep.job not in new_jobs and dep.job not in stored_jobs and ("Job", dep.job) not in refused:
                problems.append(
                    f"{m.where('spec', 'dependsOn', i, 'job')}: job {dep.job!r} does not exist "
                    "(neither stored nor in this apply)"
                )
        if spec.pool is not None and spec.pool not in pools:
            if ("Pool", spec.pool) in refused:
                continue
            problems.append(f"{m.where('spec', 'pool')}: pool {spec.pool!r} does not exist")
        elif spec.pool is not None and (cap := _capacity(pools[spec.pool])) is not None and spec.slots > cap:
            problems.append(
                f"{m.where('spec', 'slots')}: {spec.slots} slots can never fit pool {spec.pool!r} ({cap} slots)"
            )
        if global_cap is not None and spec.slots > global_cap:
            problems.append(
                f"{m.where('spec', 'slots')}: {spec.slots} slots can never fit the global limit ({global_cap} slots)"
            )

    cycle = find_cycle(graph, sorted(new_jobs))
    if cycle:
        m = new_jobs.get(cycle[0]) or next(new_jobs[n] for n in cycle if n in new_jobs)
        problems.append(f"{m.where('spec', 'dependsOn')}: dependency cycle: {' -> '.join(cycle)}")

    for m in manifests:  # a pool shrunk below a job that names it would strand that job forever
        if m.kind.kind != "Pool" or (cap := _capacity(pools[m.name])) is None:
            continue
        for job, (pool, slots) in sorted(job_slots.items()):
            if (pool == m.name or m.name == GLOBAL_POOL) and slots > cap:
                problems.append(f"{m.where('spec', 'slots')}: {cap} slots is less than job {job!r} needs ({slots})")
                break
    return problems
