"""Queue, admissions and node allocation: the facts admission and placement decide on, and
the rows that record their decisions. Called inside one write transaction per decision."""

from __future__ import annotations

import functools
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, bindparam, delete, func, insert, literal_column, select, tuple_, update

from .engine import Tx
from .prepared import Prepared
from .tables import AdmissionRow, EventRow, ObjectRow, QueueRow

QUEUE = QueueRow.__table__
ADMISSIONS = AdmissionRow.__table__
NODE_READY_WINDOW = 40.0  # seconds without a heartbeat before a node is NotReady

# Statements built once: on the reconcile loop's path, building and caching a statement per
# call costs more than SQLite's work.
_ORDER = (QUEUE.c.rank, QUEUE.c.eligible_at, QUEUE.c.job_uid)
_QUEUED = Prepared(select(QUEUE).where(QUEUE.c.job_uid == bindparam("uid")))
_ENQUEUE = Prepared(insert(QUEUE).values({c.name: bindparam(c.name) for c in QUEUE.c}))
_DEQUEUE = Prepared(delete(QUEUE).where(QUEUE.c.job_uid == bindparam("uid")))
_OBJECTS = ObjectRow.__table__
_POOL_SPEC = (
    select(_OBJECTS.c.spec).where(_OBJECTS.c.kind == "Pool", _OBJECTS.c.name == bindparam("name")).scalar_subquery()
)
_USED_ALL = select(func.coalesce(func.sum(ADMISSIONS.c.slots), 0))
_USED_IN_POOL = _USED_ALL.where(ADMISSIONS.c.pool == bindparam("name"))
# a pool's spec and its slots in use in one round trip
_POOL_FACTS = {
    True: Prepared(select(_POOL_SPEC, _USED_ALL.scalar_subquery())),
    False: Prepared(select(_POOL_SPEC, _USED_IN_POOL.scalar_subquery())),
}
_ALLOCATED = (
    select(ADMISSIONS.c.node, func.sum(ADMISSIONS.c.slots).label("allocated")).group_by(ADMISSIONS.c.node).subquery()
)
# every node with the slots allocated on it, in one round trip
_NODES = Prepared(
    select(
        _OBJECTS.c.name,
        _OBJECTS.c.spec,
        _OBJECTS.c.status,
        _OBJECTS.c.labels,
        func.coalesce(_ALLOCATED.c.allocated, 0).label("allocated"),
    )
    .select_from(_OBJECTS.outerjoin(_ALLOCATED, _ALLOCATED.c.node == _OBJECTS.c.name))
    .where(_OBJECTS.c.kind == "Node")
)
_ADMIT = Prepared(insert(ADMISSIONS).values({c.name: bindparam(c.name) for c in ADMISSIONS.c}))
_ADMISSION = Prepared(select(ADMISSIONS).where(ADMISSIONS.c.job_uid == bindparam("uid")))
_RELEASE = Prepared(
    delete(ADMISSIONS).where(ADMISSIONS.c.job_uid == bindparam("uid")).returning(ADMISSIONS.c.pool, ADMISSIONS.c.slots)
)
_COUNT_BYPASS = Prepared(
    update(QUEUE).where(QUEUE.c.job_uid == bindparam("uid")).values(bypass_count=QUEUE.c.bypass_count + 1)
)
_CLAIM = Prepared(
    update(ADMISSIONS)
    .where(ADMISSIONS.c.job_uid == bindparam("uid"), ADMISSIONS.c.owner.is_(None))
    .values(owner=bindparam("owner"))
)
_TAKE_OVER = Prepared(
    update(ADMISSIONS)
    .where(ADMISSIONS.c.job_uid == bindparam("uid"), ADMISSIONS.c.owner == bindparam("previous"))
    .values(owner=bindparam("owner"))
)
_WRITTEN_SINCE = Prepared(
    select(_OBJECTS.c.kind, _OBJECTS.c.name, _OBJECTS.c.resource_version).where(
        _OBJECTS.c.resource_version > bindparam("rv")
    )
)
_DELETED_SINCE = Prepared(
    select(EventRow.kind, EventRow.name, EventRow.resource_version).where(
        EventRow.resource_version > bindparam("rv"), EventRow.reason == "Deleted"
    )
)


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
    def from_row(cls, row: QueueRow) -> QueueEntry:
        return cls(
            row.job_uid,
            row.job_name,
            row.pool,
            row.slots,
            row.rank,
            row.eligible_at,
            row.bypass_count,
            row.node_name,
            json.loads(row.node_selector),
        )


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


def enqueue(
    tx: Tx,
    *,
    uid: str,
    name: str,
    pool: str | None,
    slots: int,
    priority: int,
    eligible_at: float,
    bypass_count: int,
    node_name: str | None,
    node_selector: dict[str, str],
) -> QueueEntry:
    """Idempotent: a job already queued keeps its row (and its bypass count). Returns the row."""
    entry = queued(tx.session, uid)
    if entry is None:
        entry = QueueEntry(uid, name, pool, slots, -priority, eligible_at, bypass_count, node_name, dict(node_selector))
        _ENQUEUE.execute(
            tx.session,
            dict(
                job_uid=uid,
                job_name=name,
                pool=pool,
                slots=slots,
                rank=-priority,
                eligible_at=eligible_at,
                bypass_count=bypass_count,
                node_name=node_name,
                node_selector=json.dumps(node_selector, sort_keys=True),
            ),
        )
    return entry


def dequeue(tx: Tx, uid: str) -> None:
    _DEQUEUE.execute(tx.session, {"uid": uid})


def queued(session: Connection, uid: str) -> QueueEntry | None:
    row = _QUEUED.execute(session, {"uid": uid}).first()
    return QueueEntry.from_row(row) if row else None


@functools.cache
def _line(scope_is_pool: bool, after: bool, batch: int):
    """A page of one scope's queue in admission order. Keyset paging (after the last row
    read) and a literal LIMIT: with a bound LIMIT or OFFSET, PostgreSQL's generic plan for a
    prepared statement cannot know the page is small and may sort the whole queue."""
    query = select(QUEUE)
    if scope_is_pool:
        query = query.where(QUEUE.c.pool == bindparam("pool"))
    if after:
        query = query.where(tuple_(*_ORDER) > tuple_(bindparam("rank"), bindparam("eligible_at"), bindparam("uid")))
    return Prepared(query.order_by(*_ORDER).limit(literal_column(str(int(batch)))))


def in_line(session: Connection, pool: str | None, *, scope_is_pool: bool, batch: int = 16) -> Iterator[QueueEntry]:
    """The queue of one scope in admission order, read `batch` rows at a time as the caller
    goes on (most callers stop at the first entry or two)."""
    params: dict = {"pool": pool}
    query = _line(scope_is_pool, False, batch)
    while True:
        rows = query.execute(session, params).all()
        yield from (QueueEntry.from_row(row) for row in rows)
        if len(rows) < batch:
            return
        last = rows[-1]
        params = {"pool": pool, "rank": last.rank, "eligible_at": last.eligible_at, "uid": last.job_uid}
        query = _line(scope_is_pool, True, batch)


def first_in_line(session: Connection, pool: str | None, limit: int) -> list[str]:
    """Names of the first `limit` queued jobs of a scope: who to wake when slots free up."""
    return [
        entry.name
        for entry in itertools.islice(
            in_line(session, pool, scope_is_pool=pool is not None, batch=min(max(limit, 1), 64)), limit
        )
    ]


def count_bypass(tx: Tx, uid: str) -> None:
    _COUNT_BYPASS.execute(tx.session, {"uid": uid})


def pool_facts(session: Connection, name: str) -> PoolFacts:
    spec_text, used = _POOL_FACTS[name == "global"].execute(session, {"name": name}).one()
    spec = json.loads(spec_text) if spec_text else {}
    slots = spec.get("slots", "unlimited")
    return PoolFacts(name, None if slots == "unlimited" else int(slots), int(spec.get("maxBypass", 3)), int(used))


def node_facts(session: Connection, now: float | None = None) -> list[NodeFacts]:
    now = time.time() if now is None else now
    facts = []
    for row in _NODES.execute(session).all():
        spec, status = json.loads(row.spec), json.loads(row.status or "{}")
        capacity = spec.get("capacity", {}).get("slots")
        if capacity is None:
            capacity = status.get("cpuCount") or 1
        beat = status.get("heartbeatAt")
        fresh = (
            beat is not None
            and now - datetime.fromisoformat(beat.replace("Z", "+00:00")).timestamp() < NODE_READY_WINDOW
        )
        facts.append(
            NodeFacts(
                row.name,
                json.loads(row.labels),
                bool(spec.get("unschedulable")),
                int(capacity),
                int(row.allocated),
                fresh,
            )
        )
    return facts


def admit(
    tx: Tx, *, uid: str, name: str, pool: str | None, slots: int, node: str, run_number: int, owner: str | None = None
) -> float:
    """Record the admission; `owner` claims the spawn at once when the admitting controller
    is the node's own agent."""
    now = time.time()
    _ADMIT.execute(
        tx.session,
        dict(
            job_uid=uid,
            job_name=name,
            pool=pool,
            slots=slots,
            node=node,
            run_number=run_number,
            admitted_at=now,
            owner=owner,
        ),
    )
    dequeue(tx, uid)
    return now


@dataclass(frozen=True)
class Admission:
    """What starting a run needs of an admission row."""

    node: str | None
    run_number: int
    owner: str | None


def admission(session: Connection, uid: str) -> Admission | None:
    row = _ADMISSION.execute(session, {"uid": uid}).first()
    return None if row is None else Admission(row.node, row.run_number, row.owner)


def claim_spawn(tx: Tx, uid: str, owner: str, *, take_over_from: str | None = None) -> bool:
    """Compare-and-swap the right to start this admission's run: no run starts twice."""
    if take_over_from is None:
        return _CLAIM.execute(tx.session, {"uid": uid, "owner": owner}).rowcount == 1
    return _TAKE_OVER.execute(tx.session, {"uid": uid, "owner": owner, "previous": take_over_from}).rowcount == 1


def release(tx: Tx, uid: str) -> tuple[str | None, int] | None:
    """Free the slots; returns (pool, slots) held, so the caller can wake who waits for them."""
    row = _RELEASE.execute(tx.session, {"uid": uid}).first()
    return None if row is None else (row.pool, row.slots)


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
    written = _WRITTEN_SINCE.execute(session, {"rv": rv}).all()
    deleted = _DELETED_SINCE.execute(session, {"rv": rv}).all()
    return [tuple(r) for r in written] + [tuple(r) for r in deleted]


def open_job_names(session: Connection) -> list[str]:
    """Jobs that are not Completed (or were never reconciled): the controller's start-up work."""
    return list(
        session.scalars(
            select(ObjectRow.name).where(
                ObjectRow.kind == "Job", (ObjectRow.phase.is_(None)) | (ObjectRow.phase != "Completed")
            )
        )
    )


def job_names_needing_revision(session: Connection) -> list[str]:
    """Completed jobs that may be due a new revision: their spec changed since they were
    reconciled, or a rerun was asked for (the reconciler tells an old request from a new)."""
    c = _OBJECTS.c
    return list(
        session.scalars(
            select(c.name).where(
                c.kind == "Job",
                c.phase == "Completed",
                (c.observed_generation.is_(None))
                | (c.observed_generation != c.generation)
                | c.annotations.like('%"reconciler.dev/rerun"%'),
            )
        )
    )


def dependency_graph(session: Connection) -> dict[str, list[str]]:
    """job -> the jobs it depends on, for waking dependents when a job completes. Specs
    without dependencies (canonical JSON: `"dependsOn":[]`) are not even parsed."""
    c = _OBJECTS.c
    rows = session.execute(select(c.name, c.spec).where(c.kind == "Job", c.spec.not_like('%"dependsOn":[]%')))
    return {name: [d["job"] for d in json.loads(spec).get("dependsOn", [])] for name, spec in rows}


def usage(session: Connection) -> tuple[dict[str | None, int], dict[str | None, int], dict[str | None, int]]:
    """(slots used per pool, jobs queued per pool, slots allocated per node), for `get`."""
    used = dict(
        session.execute(select(ADMISSIONS.c.pool, func.sum(ADMISSIONS.c.slots)).group_by(ADMISSIONS.c.pool)).all()
    )
    queued_ = dict(session.execute(select(QUEUE.c.pool, func.count()).group_by(QUEUE.c.pool)).all())
    nodes = dict(
        session.execute(select(ADMISSIONS.c.node, func.sum(ADMISSIONS.c.slots)).group_by(ADMISSIONS.c.node)).all()
    )
    return used, queued_, nodes
