"""The job graph (`graph`), as data: each job with what `get` shows of it, and an edge from each
dependency to its dependent. The CLI renders it (mermaid, dot); the HTTP API will answer with
it. Nothing here writes."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .api.status import shown_state
from .errors import NotFound
from .selectors import Requirement, matches
from .store import Store, StoredObject
from .store import repository as repo

if TYPE_CHECKING:
    from .manifests import Manifest

NOT_APPLIED = "NotApplied"  # in the manifests given, not stored yet
MISSING = "Missing"  # named by a dependency, but neither stored nor given (deleted, or never applied)
TERMINATING = "Terminating"  # deleted while running: what `get` shows of it


@dataclass(frozen=True)
class GraphNode:
    name: str
    state: str  # what `get` shows (an outcome once Completed, else the phase), or one of the three above


@dataclass(frozen=True)
class GraphEdge:
    dependency: str
    dependent: str
    outcomes: tuple[str, ...]  # what the edge asks of the dependency's outcome


@dataclass(frozen=True)
class Graph:
    nodes: list[GraphNode]  # dependencies before their dependents, then by name
    edges: list[GraphEdge]  # in the order of their dependencies, then of their dependents


def state_of(obj: StoredObject) -> str:
    return TERMINATING if obj.deleted_at is not None else shown_state(obj.status)


def stored_graph(store: Store, selector: list[Requirement] | None = None) -> Graph:
    """Every stored job, or those matching `selector` and the edges between them. A dependency
    on a job that does not exist is drawn to a Missing node in either case: the selected job
    names it, and it is why that job cannot run."""
    with store.read() as session:
        jobs = repo.list_objects(session, kind="Job")
    stored = {o.name for o in jobs}
    chosen = [o for o in jobs if selector is None or matches(selector, o.labels)]
    states = {o.name: state_of(o) for o in chosen}
    edges = [
        GraphEdge(dep["job"], o.name, tuple(dep.get("outcomes") or ("Succeeded",)))
        for o in chosen
        for dep in o.spec.get("dependsOn", [])
        if dep["job"] in states or dep["job"] not in stored
    ]
    for edge in edges:
        states.setdefault(edge.dependency, MISSING)
    return _ordered(states, edges)


def manifest_graph(store: Store, manifests: Iterable[Manifest]) -> Graph:
    """The jobs of these manifests as they would be applied: their edges as the manifests say,
    each with its stored state (NotApplied when it is not stored yet). A dependency outside the
    manifests is drawn with its stored state, or as Missing when it is not stored either (apply
    would refuse it). NotFound when the manifests hold no job."""
    given = {m.name: m.obj.spec.depends_on for m in manifests if m.kind.kind == "Job"}
    if not given:
        raise NotFound("no jobs in the manifests given: nothing to graph")
    edges = [
        GraphEdge(dep.job, name, tuple(str(o) for o in dep.outcomes)) for name, deps in given.items() for dep in deps
    ]
    wanted = sorted(set(given) | {e.dependency for e in edges})
    with store.read() as session:
        stored = {o.name: state_of(o) for o in repo.list_objects(session, kind="Job", names=wanted)}
    states = {name: stored.get(name, NOT_APPLIED if name in given else MISSING) for name in wanted}
    return _ordered(states, edges)


def _ordered(states: dict[str, str], edges: list[GraphEdge]) -> Graph:
    """Nodes in topological order (ties by name), so the text reads top-down like the
    pipeline; a cycle (only an unvalidated manifest can hold one) keeps the rest by name."""
    edges = list(dict.fromkeys(edges))  # a dependency listed twice is one edge
    dependents: defaultdict[str, list[str]] = defaultdict(list)
    waiting = dict.fromkeys(states, 0)
    for e in edges:
        dependents[e.dependency].append(e.dependent)
        waiting[e.dependent] += 1
    ready = [n for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for d in dependents[name]:
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(ready, d)
    placed = set(order)
    order += sorted(n for n in states if n not in placed)
    position = {n: i for i, n in enumerate(order)}
    return Graph(
        [GraphNode(n, states[n]) for n in order],
        sorted(edges, key=lambda e: (position[e.dependency], position[e.dependent])),
    )
