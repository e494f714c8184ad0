"""Reads: what `get`, `describe` and `logs` show, as data (what `get -w` follows is in
watching.py). The CLI renders it; the HTTP API (server/) answers with it. Nothing here
writes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from .api.kinds import resolve_kind
from .api.meta import from_epoch, to_epoch
from .api.node import heartbeat_fresh, observed_status
from .api.status import Phase
from .errors import NotFound
from .selectors import Requirement, matches
from .store import Store, StoredObject, eventlog, outbox, queuing
from .store import repository as repo
from .store import scheduling as sched

SERVICES = ("services", "service", "svc")
EVENTS = ("events", "event", "ev")


def shown(obj: StoredObject) -> tuple[int, str]:
    """What a follower compares to decide whether an object looks different: its version
    and its status as shown (derived parts included)."""
    return obj.resource_version, json.dumps(obj.status, sort_keys=True, default=str)


@dataclass(frozen=True)
class Listing:
    kind: str  # Job, Pool, Node, Notifier, or Service (jobs of type service)
    objects: list[StoredObject]
    missing: list[str] = field(default_factory=list)  # names asked for that do not exist (when not strict)


def objects(
    store: Store, kind: str, names: list[str], selector: list[Requirement] | None, *, strict: bool = True
) -> Listing:
    """The objects of a kind (all, or the named ones: NotFound names every missing one, or,
    unless `strict`, the listing does), filtered by a label selector; pools and nodes with
    their usage."""
    if kind.lower() in SERVICES:
        found = [s for s in service_registry(store) if not names or s.name in names]
        label = "Service"
    else:
        info = resolve_kind(kind)
        with store.read() as session:
            found = repo.list_objects(session, kind=info.kind, names=names or None)
        label = info.kind
    return decorated(store, label, found, names, selector, strict=strict)


def decorated(
    store: Store,
    label: str,
    found: list[StoredObject],
    names: list[str],
    selector: list[Requirement] | None,
    *,
    strict: bool,
) -> Listing:
    """A listing of objects read: what `get` derives at read time added, the missing names,
    the selector applied."""
    if label in ("Pool", "Node"):
        _with_usage(store, label, found)
    if label == "Notifier":
        _with_deliveries(store, found)
    if label == "Node":
        _as_observed(found)
    if label == "Job":
        _with_paths_checked(store, found)
        _with_queue_places(store, found)
    present = {o.name for o in found}
    missing = [n for n in names if n not in present]
    if missing and strict:
        raise NotFound("; ".join(not_found(label, n) for n in missing))
    if selector:
        found = [o for o in found if matches(selector, o.labels)]
    return Listing(label, found, missing)


def listing_at(store: Store, kind: str, names: list[str], selector: list[Requirement] | None) -> tuple[int, Listing]:
    """A kind's objects and the resourceVersion a watch of them starts from: read before them,
    so a watch from it misses no change (one that the listing already shows may come again)."""
    seq = store.change_seq()
    return seq, objects(store, kind, names, selector)


def is_service(obj: StoredObject) -> bool:
    return obj.spec.get("type") == "service"


def service_registry(store: Store) -> list[StoredObject]:
    """The service registry (`get services`, `GET /services`): a Service for each service
    job whose run is alive and, when it has a readiness probe, passed its last probe; with
    the node that runs it, the node's address and the port. Derived at read time from the
    jobs and nodes, never stored: it cannot disagree with them."""
    with store.read() as session:
        jobs = [o for o in repo.list_objects(session, kind="Job") if is_service(o)]
        nodes = {n.name: n.status or {} for n in repo.list_objects(session, kind="Node")} if jobs else {}
    entries = []
    for job in jobs:
        status = job.status or {}
        runs = status.get("runs") or []
        run = runs[-1] if runs and not runs[-1].get("finishedAt") else None
        if status.get("phase") != Phase.RUNNING or run is None or job.deleted_at is not None:
            continue  # between runs, stopping, or never started: nothing to reach
        has_probe = job.spec.get("readiness") is not None
        if has_probe and not status.get("ready"):
            continue
        node = run.get("node") or status.get("nodeName")
        entry = {
            "name": job.name,
            "node": node,
            "address": nodes.get(node or "", {}).get("address"),
            "port": job.spec.get("port"),
            "run": run.get("number"),
            "ready": True,
            # beyond API.md's six fields: what `get services` shows, the same through a server
            "readinessProbe": has_probe,
            "startedAt": run.get("startedAt"),
            "uid": job.uid,
            "labels": job.labels,
            "resourceVersion": str(job.resource_version),
            "generation": job.generation,
            "creationTimestamp": from_epoch(job.created_at),
        }
        entries.append(service_object(entry))
    return entries


def service_object(entry: dict[str, Any]) -> StoredObject:
    """A registry entry as the object `get services` lists (its status is the entry), the
    same from the store and from a server's `GET /services`."""
    spec = {"job": entry["name"]}
    created = entry.get("creationTimestamp")
    return StoredObject(
        kind="Service",
        name=entry["name"],
        uid=entry.get("uid") or "",
        generation=int(entry.get("generation") or 0),
        resource_version=int(entry.get("resourceVersion") or 0),
        labels=dict(entry.get("labels") or {}),
        annotations={},
        spec=spec,
        status=entry,
        created_at=to_epoch(created) if created else 0.0,
        deleted_at=None,
        spec_text=json.dumps(spec),
    )


def services(store: Store, selector: list[Requirement] | None = None) -> list[dict[str, Any]]:
    """The registry in the HTTP API's shape (`GET /services`), of the services whose labels
    (their jobs') match `selector`."""
    return [dict(s.status or {}) for s in service_registry(store) if not selector or matches(selector, s.labels)]


def not_found(label: str, name: str) -> str:
    return f'{label.lower()}s "{name}" not found'


def _with_usage(store: Store, label: str, objs: list[StoredObject]) -> None:
    """Pool and node usage are derived from the admissions table, never stored twice."""
    with store.read() as session:
        used, queued, _ = sched.usage(session)
        nodes = {f.name: f for f in sched.node_facts(session)} if label == "Node" else {}
    for o in objs:
        status = dict(o.status or {})
        if label == "Pool":
            total = sum(used.values()) if o.name == "global" else used.get(o.name, 0)
            waiting = sum(queued.values()) if o.name == "global" else queued.get(o.name, 0)
            status.update(used=int(total or 0), queued=int(waiting or 0))
        else:
            facts = nodes.get(o.name)
            status["allocated"] = facts.allocated_status() if facts else {"slots": 0}
        o.status = status


def _with_deliveries(store: Store, notifiers: list[StoredObject]) -> None:
    """A notifier's delivered, pending and failed counts, last error and last delivery, read
    from the outbox (never written into the object: a delivery is no change of it)."""
    with store.read() as session:
        for o in notifiers:
            found = outbox.deliveries(session, o.name)
            status: dict[str, Any] = {"delivered": found.delivered, "pending": found.pending, "failed": found.failed}
            if found.last_delivery_at is not None:
                status["lastDeliveryTime"] = from_epoch(found.last_delivery_at)
            if found.last_error is not None:
                status["lastError"] = found.last_error
                status["lastErrorTime"] = from_epoch(found.last_error_at or 0.0)
            o.status = status


def _as_observed(nodes: list[StoredObject]) -> None:
    """Nodes as they stand now: Ready Unknown once their heartbeat is stale."""
    now = time.time()
    for node in nodes:
        node.status = observed_status(node.status, now)


def _with_paths_checked(store: Store, jobs: list[StoredObject]) -> None:
    """A path that waiting jobs wait for is checked every poll interval by the controller's
    path watcher, which writes nothing until the path appears (a write per job per second
    would be most of an idle controller's cost). Its node's heartbeat records when it last
    checked them all: an unsatisfied path wait of a Waiting job was last checked then."""
    waiting = [
        job
        for job in jobs
        if (job.status or {}).get("phase") == Phase.WAITING
        and any(w.get("type") == "path" and not w.get("satisfied") for w in (job.status or {}).get("waits", []))
    ]
    if not waiting:
        return
    now = time.time()
    with store.read() as session:
        nodes = repo.list_objects(session, kind="Node")
    statuses = [n.status or {} for n in nodes]
    stamps = [s["pathsCheckedAt"] for s in statuses if heartbeat_fresh(s, now) and s.get("pathsCheckedAt")]
    if not stamps:
        return
    checked = max(stamps)  # RFC 3339 UTC with milliseconds: in order as text
    for job in waiting:
        status = dict(job.status or {})
        status["waits"] = [
            {**w, "lastCheckedAt": checked}
            if w.get("type") == "path" and not w.get("satisfied") and checked > (w.get("lastCheckedAt") or "")
            else w
            for w in status.get("waits", [])
        ]
        job.status = status


def _with_queue_places(store: Store, jobs: list[StoredObject]) -> None:
    """A Queued job's place in its line, read now: `status.queue` = {pool, position, length}
    and, when a finite scope has no room for it, `full` = {scope, name, used, capacity,
    needed}. Never stored: the line moves without the job being written. One read of the
    queue, whatever the number of jobs (waiting.py words it)."""
    queued = [job for job in jobs if (job.status or {}).get("phase") == Phase.QUEUED]
    if not queued:
        return
    with store.read() as session:
        places = queue_places(session)
        facts: dict[str, sched.PoolFacts] = {}
        for job in queued:
            place = places.get(job.uid)
            if place is None:
                continue  # between its phase write and its queue row (or admitted meanwhile)
            entry = dict(place)
            if (full := _full_scope(session, facts, job)) is not None:
                entry["full"] = full
            job.status = {**(job.status or {}), "queue": entry}


def queue_places(session: Any) -> dict[str, dict[str, Any]]:
    """uid -> {pool, position, length} of every queued job: its place in its pool's line
    (the global line for a job without a pool), in admission order."""
    lines: dict[str | None, list[str]] = {}
    for entry in queuing.in_line(session, None, scope_is_pool=False, batch=QUEUE_PAGE):
        lines.setdefault(entry.pool, []).append(entry.uid)
    return {
        uid: {"pool": pool, "position": n, "length": len(uids)}
        for pool, uids in lines.items()
        for n, uid in enumerate(uids, 1)
    }


QUEUE_PAGE = 500  # rows of the queue read at a time


def _full_scope(session: Any, facts: dict[str, sched.PoolFacts], job: StoredObject) -> dict[str, Any] | None:
    """The first finite scope (the global limit, then the job's pool) without room for it."""
    slots = int(job.spec.get("slots", 1))
    pool = job.spec.get("pool")
    for name in ["global"] + ([pool] if pool else []):
        if name not in facts:
            facts[name] = sched.pool_facts(session, name)
        f = facts[name]
        if f.capacity is not None and f.used + slots > f.capacity:
            scope = "global" if name == "global" else "pool"
            return {"scope": scope, "name": name, "used": f.used, "capacity": f.capacity, "needed": slots}
    return None


def pool_queues(store: Store, limit: int) -> dict[str | None, tuple[int, list[StoredObject]]]:
    """Each line's length and its first `limit` jobs in admission order, as `get` shows them
    (with their place): what the dashboard's pools page lists. Key None: the global line."""
    with store.read() as session:
        lines: dict[str | None, list[str]] = {}
        for entry in queuing.in_line(session, None, scope_is_pool=False, batch=QUEUE_PAGE):
            lines.setdefault(entry.pool, []).append(entry.name)
    shown = [name for names in lines.values() for name in names[:limit]]
    found = {o.name: o for o in objects(store, "jobs", shown, None, strict=False).objects}
    return {pool: (len(names), [found[n] for n in names[:limit] if n in found]) for pool, names in lines.items()}


def events(store: Store, names: list[str], limit: int = 1000) -> list[Any]:
    """The newest events, oldest first, of the named objects or of all."""
    with store.read() as session:
        rows = eventlog.newest(session, limit=limit)
    return [r for r in rows if r.name in names] if names else rows


DESCRIBED_EVENTS = 50  # the newest events of the object `describe` shows


def object_events(store: Store, kind: str, name: str, limit: int = DESCRIBED_EVENTS) -> list[Any]:
    """The newest events of one object, oldest first (what `describe` shows of them)."""
    info = resolve_kind(kind)
    with store.read() as session:
        return eventlog.newest(session, kind=info.kind, name=name, limit=limit)


def describe(store: Store, kind: str, name: str) -> tuple[StoredObject, list[Any]]:
    """One object, as `get` shows it (a pool's usage, a node's allocation), and its latest events."""
    info = resolve_kind(kind)
    with store.read() as session:
        obj = repo.get(session, kind=info.kind, name=name)
        if obj is None:
            raise NotFound(f'{info.plural} "{name}" not found')
        found = eventlog.newest(session, kind=info.kind, name=name, limit=DESCRIBED_EVENTS)
    found = [e for e in found if e.uid == obj.uid]  # not those of an earlier object of the name
    if obj.kind in ("Pool", "Node"):
        _with_usage(store, obj.kind, [obj])
    if obj.kind == "Node":
        _as_observed([obj])
    if obj.kind == "Job":
        _with_paths_checked(store, [obj])
        _with_queue_places(store, [obj])
    if obj.kind == "Notifier":
        _with_deliveries(store, [obj])
    return obj, found


def job_statuses(store: Store, names: list[str]) -> dict[str, dict[str, Any]]:
    """name -> status of the named jobs (benchmarks and tests read them this way)."""
    with store.read() as session:
        return {o.name: (o.status or {}) for o in repo.list_objects(session, kind="Job", names=names)}
