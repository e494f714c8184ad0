"""Queue, admissions and node allocation: the facts admission and placement decide on, and
the rows that record their decisions. Called inside one write transaction per decision."""

from __future__ import annotations

import json
import time
from datetime import datetime
from dataclasses import dataclass
from typing import Iterator

from sqlalchemy import Connection, bindparam, delete, func, insert, select, update

from .engine import Tx
from .tables import AdmissionRow, EventRow, ObjectRow, QueueRow

QUEUE = QueueRow.__table__
ADMISSIONS = AdmissionRow.__table__
NODE_READY_WINDOW = 40.0

# Statements built once: on the reconcile loop's path, building and caching a statement per
# call costs more than SQLite's work.
_ORDER = (QUEUE.c.rank, QUEUE.c.eligible_at, QUEUE.c.job_uid)
_QUEUED = select(QUEUE).where(QUEUE.c.job_uid == bindparam("uid"))
_ENQUEUE = insert(QUEUE)
_DEQUEUE = delete(QUEUE).where(QUEUE.c.job_uid == bindparam("uid"))
_LINE = select(QUEUE).order_by(*_ORDER).limit(bindparam("limit")).offset(bindparam("offset"))
_LINE_OF_POOL = select(QUEUE).where(QUEUE.c.pool == bindparam("pool")).order_by(*_ORDER) \
    .limit(bindparam("limit")).offset(bindparam("offset"))
_OBJECTS = ObjectRow.__table__
_POOL_SPEC = select(_OBJECTS.c.spec).where(_OBJECTS.c.kind == "Pool", _OBJECTS.c.name == bindparam("name"))
_USED_ALL = select(func.coalesce(func.sum(ADMISSIONS.c.slots), 0))
_USED_IN_POOL = _USED_ALL.where(ADMISSIONS.c.pool == bindparam("pool"))
_ALLOCATED = select(ADMISSIONS.c.node, func.sum(ADMISSIONS.c.slots)).group_by(ADMISSIONS.c.node)
_NODES = select(_OBJECTS.c.name, _OBJECTS.c.spec, _OBJECTS.c.status, _OBJECTS.c.labels).where(_OBJECTS.c.kind == "Node")
_ADMIT = insert(ADMISSIONS)
_ADMISSION = select(ADMISSIONS).where(ADMISSIONS.c.job_uid == bindparam("uid"))
_RELEASE = delete(ADMISSIONS).where(ADMISSIONS.c.job_uid == bindparam("uid"))  # seconds without a heartbeat before a node is NotReady


@dataclass(frozen=True)
class QueueEntry:
    uid: str
    name: str
    pool: str | None
    slots: int
    rank: int
    eligible_at: float
    bypass_count: int
    node_name: str | None
    node_selector: dict[str, str]

    @classmethod
    def from_row(cls, row: QueueRow) -> "QueueEntry":
        return cls(row.job_uid, row.job_name, row.pool, row.slots, row.rank, row.eligible_at, row.bypass_count,
                   row.node_name, json.loads(row.node_selector))


@dataclass(frozen=True)
class PoolFacts:
    name: str
    capacity: int | None
    max_bypass: int
    used: int


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: dict[str, str]
    unschedulable: bool
    capacity: int
    allocated: int
    ready: bool


def enqueue(tx: Tx, *, uid: str, name: str, pool: str | None, slots: int, priority: int, eligible_at: float,
            bypass_count: int, node_name: str | None, node_selector: dict[str, str]) -> None:
    """Idempotent: a job already queued keeps its row (and its bypass count)."""
    if queued(tx.session, uid) is None:
        tx.session.execute(_ENQUEUE, dict(
            job_uid=uid, job_name=name, pool=pool, slots=slots, rank=-priority, eligible_at=eligible_at,
            bypass_count=bypass_count, node_name=node_name, node_selector=json.dumps(node_selector, sort_keys=True)))


def dequeue(tx: Tx, uid: str) -> None:
    tx.session.execute(_DEQUEUE, {"uid": uid})


def queued(session: Connection, uid: str) -> QueueEntry | None:
    row = session.execute(_QUEUED, {"uid": uid}).first()
    return QueueEntry.from_row(row) if row else None


def head(session: Connection, pool: str | None, *, scope_is_pool: bool) -> QueueEntry | None:
    """First in line in one scope: the named pool's queue, or every queued job (global)."""
    return next(in_line(session, pool, scope_is_pool=scope_is_pool, batch=1), None)


def in_line(session: Connection, pool: str | None, *, scope_is_pool: bool, batch: int = 16) -> Iterator[QueueEntry]:
    """The queue of one scope in admission order, read `batch` rows at a time as the caller
    goes on (most callers stop at the first entry or two)."""
    query = _LINE_OF_POOL if scope_is_pool else _LINE
    offset = 0
    while True:
        rows = session.execute(query, {"pool": pool, "limit": batch, "offset": offset}).all()
        yield from (QueueEntry.from_row(row) for row in rows)
        if len(rows) < batch:
            return
        offset += batch


def first_in_line(session: Connection, pool: str | None, limit: int) -> list[str]:
    """Names of the first `limit` queued jobs of a scope: who to wake when slots free up."""
    query = _LINE_OF_POOL if pool is not None else _LINE
    return [row.job_name for row in session.execute(query, {"pool": pool, "limit": limit, "offset": 0})]


def count_bypass(tx: Tx, uid: str) -> None:
    tx.session.execute(update(QueueRow).where(QueueRow.job_uid == uid).values(bypass_count=QueueRow.bypass_count + 1))


def pool_facts(session: Connection, name: str) -> PoolFacts:
    spec_text = session.execute(_POOL_SPEC, {"name": name}).scalar()
    spec = json.loads(spec_text) if spec_text else {}
    slots = spec.get("slots", "unlimited")
    used = session.execute(_USED_ALL if name == "global" else _USED_IN_POOL, {"pool": name}).scalar()
    return PoolFacts(name, None if slots == "unlimited" else int(slots), int(spec.get("maxBypass", 3)), int(used))


def node_facts(session: Connection, now: float | None = None) -> list[NodeFacts]:
    now = time.time() if now is None else now
    allocated = dict(session.execute(_ALLOCATED).all())
    facts = []
    for row in session.execute(_NODES):
        spec, status = json.loads(row.spec), json.loads(row.status or "{}")
        capacity = spec.get("capacity", {}).get("slots")
        if capacity is None:
            capacity = status.get("cpuCount") or 1
        beat = status.get("heartbeatAt")
        fresh = beat is not None and now - datetime.fromisoformat(beat.replace("Z", "+00:00")).timestamp() < NODE_READY_WINDOW
        facts.append(NodeFacts(row.name, json.loads(row.labels), bool(spec.get("unschedulable")), int(capacity),
                               int(allocated.get(row.name, 0)), fresh))
    return facts


def admit(tx: Tx, *, uid: str, name: str, pool: str | None, slots: int, node: str, run_number: int,
          owner: str | None = None) -> float:
    """Record the admission; `owner` claims the spawn at once when the admitting controller
    is the node's own agent."""
    now = time.time()
    tx.session.execute(_ADMIT, dict(job_uid=uid, job_name=name, pool=pool, slots=slots, node=node,
                                    run_number=run_number, admitted_at=now, owner=owner))
    dequeue(tx, uid)
    return now


def admission(session: Connection, uid: str) -> AdmissionRow | None:
    return session.execute(_ADMISSION, {"uid": uid}).first()


def claim_spawn(tx: Tx, uid: str, owner: str, *, take_over_from: str | None = None) -> bool:
    """Compare-and-swap the right to start this admission's run: no run starts twice."""
    result = tx.session.execute(
        update(AdmissionRow)
        .where(AdmissionRow.job_uid == uid,
               (AdmissionRow.owner.is_(None) if take_over_from is None else AdmissionRow.owner == take_over_from))
        .values(owner=owner))
    return result.rowcount == 1


def release(tx: Tx, uid: str) -> AdmissionRow | None:
    """Free the slots; returns what was held so the caller can wake who waits for them."""
    row = admission(tx.session, uid)
    if row is not None:
        tx.session.execute(_RELEASE, {"uid": uid})
    return row


def round_robin_turn(tx: Tx) -> int:
    """A store-wide counter for the round-robin placement strategy."""
    from sqlalchemy import text

    row = tx.session.execute(text("UPDATE meta SET value = value + 1 WHERE key = 'rr' RETURNING value")).first()
    if row is None:
        tx.session.execute(text("INSERT INTO meta (key, value) VALUES ('rr', 0)"))
        return 0
    return int(row[0])


def changed_since(session: Connection, rv: int) -> list[tuple[str, str, int]]:
    """(kind, name, resourceVersion) of objects written or deleted after `rv`: what a
    watcher must look at (deletions are seen through their events)."""
    written = session.execute(
        select(ObjectRow.kind, ObjectRow.name, ObjectRow.resource_version).where(ObjectRow.resource_version > rv))
    deleted = session.execute(select(EventRow.kind, EventRow.name, EventRow.resource_version).where(
        EventRow.resource_version > rv, EventRow.reason == "Deleted"))
    return [tuple(r) for r in written] + [tuple(r) for r in deleted]


def open_job_names(session: Connection) -> list[str]:
    """Jobs that are not Completed (or were never reconciled): the controller's start-up work."""
    return list(session.scalars(select(ObjectRow.name).where(
        ObjectRow.kind == "Job", (ObjectRow.phase.is_(None)) | (ObjectRow.phase != "Completed"))))


def job_names_needing_revision(session: Connection) -> list[str]:
    """Completed jobs that may be due a new revision: their spec changed since they were
    reconciled, or a rerun was asked for (the reconciler tells an old request from a new)."""
    c = _OBJECTS.c
    return list(session.scalars(select(c.name).where(
        c.kind == "Job", c.phase == "Completed",
        (c.observed_generation.is_(None)) | (c.observed_generation != c.generation)
        | c.annotations.like('%"reconciler.dev/rerun"%'))))


def dependency_graph(session: Connection) -> dict[str, list[str]]:
    """job -> the jobs it depends on, for waking dependents when a job completes. Specs
    without dependencies (canonical JSON: `"dependsOn":[]`) are not even parsed."""
    c = _OBJECTS.c
    rows = session.execute(select(c.name, c.spec).where(c.kind == "Job", c.spec.not_like('%"dependsOn":[]%')))
    return {name: [d["job"] for d in json.loads(spec).get("dependsOn", [])] for name, spec in rows}


def usage(session: Connection) -> tuple[dict[str | None, int], dict[str | None, int], dict[str | None, int]]:
    """(slots used per pool, jobs queued per pool, slots allocated per node), for `get`."""
    used = dict(session.execute(select(ADMISSIONS.c.pool, func.sum(ADMISSIONS.c.slots)).group_by(ADMISSIONS.c.pool)).all())
    queued_ = dict(session.execute(select(QUEUE.c.pool, func.count()).group_by(QUEUE.c.pool)).all())
    nodes = dict(session.execute(select(ADMISSIONS.c.node, func.sum(ADMISSIONS.c.slots)).group_by(ADMISSIONS.c.node)).all())
    return used, queued_, nodes
