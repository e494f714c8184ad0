"""Checks over a whole apply set together with what is already stored: references, cycles,
capacities. Pure: the caller passes the stored specs in and gets problems back."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..yamldoc import format_path
from .job import MIN_RESTART_DELAY
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


class Stored(Protocol):
    """What the checks read of the store, asked for by name so that an apply reads only what
    it touches (a store's specview.SpecView is one)."""

    def job(self, name: str) -> dict[str, Any] | None: ...
    def pool(self, name: str) -> dict[str, Any] | None: ...
    # the jobs not Completed that name the pool (global: every job not Completed)
    def jobs_in_pool(self, pool: str) -> Iterable[tuple[str, dict[str, Any]]]: ...
    # the Sources whose template names the pool (global: every Source), with its slots
    def sources_in_pool(self, pool: str) -> Iterable[tuple[str, int]]: ...
    def pruned(self, kind: str, name: str) -> bool: ...  # stored, but this apply deletes it (--prune)


def find_cycle(edges: Callable[[str], list[str]], starts: list[str]) -> list[str] | None:
    """A dependency cycle reachable from `starts`, as [a, b, ..., a], or None (iterative
    DFS; `edges` is asked only for the jobs the walk reaches)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    children_of: dict[str, list[str]] = {}
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
                children_of[node] = edges(node)
            children = children_of[node]
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
    stored: Stored,
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

    new_pools = {m.name: m.obj.spec.model_dump(by_alias=True) for m in manifests if m.kind.kind == "Pool"}
    new_jobs = {m.name: m for m in manifests if m.kind.kind == "Job"}

    def pool(name: str) -> dict[str, Any] | None:
        return new_pools[name] if name in new_pools else stored.pool(name)

    global_cap = _capacity(pool(GLOBAL_POOL))

    def references(m: Candidate, spec: Any, *at: str) -> None:
        """What a job spec names must exist and fit: its dependencies, its pool, its slots
        (`at`: where the spec is, in the object: a Job's spec, or a Source's template)."""
        edges: dict[str, list[str]] = {}
        for i, dep in enumerate(spec.depends_on):
            if dep.job in edges and sorted(edges[dep.job]) != sorted(dep.outcomes):
                problems.append(
                    f"{m.where(*at, 'dependsOn', i)}: job {dep.job!r} is named twice with different outcomes"
                )
            edges.setdefault(dep.job, list(dep.outcomes))
            if m.kind.kind == "Job" and dep.job == m.name:
                problems.append(f"{m.where(*at, 'dependsOn', i, 'job')}: a job cannot depend on itself")
            elif dep.job not in new_jobs and ("Job", dep.job) not in refused and stored.job(dep.job) is None:
                why = (
                    "--prune would delete it: it is in none of the files applied"
                    if stored.pruned("Job", dep.job)
                    else "neither stored nor in this apply"
                )
                problems.append(f"{m.where(*at, 'dependsOn', i, 'job')}: job {dep.job!r} does not exist ({why})")
        named = pool(spec.pool) if spec.pool is not None else None
        if spec.pool is not None and named is None:
            if ("Pool", spec.pool) not in refused:
                pruned = " (--prune would delete it: it is in none of the files applied)"
                gone = pruned if stored.pruned("Pool", spec.pool) else ""
                problems.append(f"{m.where(*at, 'pool')}: pool {spec.pool!r} does not exist{gone}")
        # a pool at 0 is paused: its jobs wait until it is raised (the check when it is)
        elif spec.pool is not None and (cap := _capacity(named)) and spec.slots > cap:
            problems.append(
                f"{m.where(*at, 'slots')}: {spec.slots} slots can never fit pool {spec.pool!r} ({cap} slots)"
            )
        if global_cap and spec.slots > global_cap:
            problems.append(
                f"{m.where(*at, 'slots')}: {spec.slots} slots can never fit the global limit ({global_cap} slots)"
            )

    for m in new_jobs.values():
        references(m, m.obj.spec, "spec")
        problems.extend(_restart_problems(m, m.obj.spec, "spec"))
    for m in manifests:  # a Source's template is under every job it makes: a missing pool refuses them all
        if m.kind.kind == "Source":
            references(m, m.obj.spec.job_template(), "spec", "template")
            problems.extend(_restart_problems(m, m.obj.spec.job_template(), "spec", "template"))
        # asked of what is applied, not of the model: a notifier stored so before still validates
        elif m.kind.kind == "Notifier" and (twice := _twice(m.obj.spec.events)):
            problems.append(f"{m.where('spec', 'events')}: {', '.join(twice)} named more than once")

    def edges_of(name: str) -> list[str]:  # the new version's edges, else the stored job's
        if name in new_jobs:
            return [d.job for d in new_jobs[name].obj.spec.depends_on]
        spec = stored.job(name)
        return [d["job"] for d in spec.get("dependsOn", [])] if spec is not None else []

    # a cycle through the set passes through a job of it that depends on another: none, no walk
    depending = any(m.obj.spec.depends_on for m in new_jobs.values())
    cycle = find_cycle(edges_of, sorted(new_jobs)) if depending else None
    if cycle:
        m = new_jobs.get(cycle[0]) or next(new_jobs[n] for n in cycle if n in new_jobs)
        problems.append(f"{m.where('spec', 'dependsOn')}: dependency cycle: {' -> '.join(cycle)}")

    for m in manifests:  # a pool shrunk below a job that names it would strand that job forever
        cap = _capacity(new_pools[m.name]) if m.kind.kind == "Pool" else None
        if cap == 0:  # paused (as Airflow's pools are): every job waits until it is raised again
            continue
        too_big = _first_that_needs_more(m.name, cap, new_jobs, stored) if cap is not None else None
        if too_big is not None:
            user, slots = too_big
            problems.append(f"{m.where('spec', 'slots')}: {cap} slots is less than {user} needs ({slots})")
    return problems


def _restart_problems(m: Candidate, spec: Any, *at: str) -> list[str]:
    """A service's restart backoff that would restart it in a hot loop: asked of what is
    applied, not of the model, so a spec stored before still validates (and restart_delay
    holds it to MIN_RESTART_DELAY)."""
    restart, found = spec.restart, list[str]()
    if restart is None:
        return found
    if restart.delay < MIN_RESTART_DELAY:
        found.append(
            f"{m.where(*at, 'restart', 'delay')}: at least {MIN_RESTART_DELAY * 1000:g}ms (it doubles from there)"
        )
    return found


def _twice(items: list[str]) -> list[str]:
    return sorted({i for i in items if items.count(i) > 1})


def _first_that_needs_more(
    pool: str, cap: int, new_jobs: dict[str, Candidate], stored: Stored
) -> tuple[str, int] | None:
    """The first job (by name) naming `pool` (every job, for global) that needs more than
    `cap` slots: the applied versions, and the stored jobs not Completed (a finished job
    waits for no slot), which are read only when the pool shrinks below what it was (else
    they fit already)."""
    every = pool == GLOBAL_POOL
    needs = {f"job {n!r}": c.obj.spec.slots for n, c in new_jobs.items() if every or c.obj.spec.pool == pool}
    stored_spec = stored.pool(pool)
    before = _capacity(stored_spec)
    # a new pool has no stored users (only global is implicit: unlimited until stored); one
    # raised from 0 (paused) may hold jobs that never fitted its new size
    if (stored_spec is not None or every) and (before is None or before == 0 or cap < before):
        for name, spec in stored.jobs_in_pool(pool):
            if name not in new_jobs:
                needs[f"job {name!r}"] = int(spec.get("slots", 1))
        # a Source's template: every job it would make would be refused
        for name, slots in stored.sources_in_pool(pool):
            needs[f"the template of source {name!r}"] = slots
    return next(((n, slots) for n, slots in sorted(needs.items()) if slots > cap), None)
