"""The queue: a row per job stored Queued, in admission order `(-priority, eligibleAt, uid)`
with its durable bypass count. Each scope's line (the global limit, a pool) is read a page
at a time; an insert and a first page are asked for at once and answered when read, so on a
pipelined connection they travel with whatever is read before."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..jsontext import parse
from .dbapi import Connection, Result, Row, Statement
from .transactions import Tx

# Statements built once: on the reconcile loop's path, building a statement per call costs
# more than SQLite's work.
_QUEUE = "job_uid, job_name, pool, slots, rank, eligible_at, bypass_count, node_name, node_selector, cpu, memory"
_QUEUED = Statement(f"SELECT {_QUEUE} FROM queue WHERE job_uid = :uid")
_ENQUEUE = Statement(
    f"INSERT INTO queue ({_QUEUE}) VALUES (:job_uid, :job_name, :pool, :slots, :rank, :eligible_at,"
    " :bypass_count, :node_name, :node_selector, :cpu, :memory) ON CONFLICT (job_uid) DO NOTHING"
)
_DEQUEUE = Statement("DELETE FROM queue WHERE job_uid = :uid")
_COUNT_BYPASS = Statement("UPDATE queue SET bypass_count = bypass_count + 1 WHERE job_uid = :uid")


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
    cpu: float = 0.0  # spec.resources, what the job needs of a node that declares cpu and memory
    memory: int = 0

    @classmethod
    def from_row(cls, row: Row) -> QueueEntry:
        return cls(
            row.job_uid,
            row.job_name,
            row.pool,
            row.slots,
            row.rank,
            row.eligible_at,
            row.bypass_count,
            row.node_name,
            parse(row.node_selector),
            row.cpu or 0.0,
            row.memory or 0,
        )


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
    cpu: float = 0.0,
    memory: int = 0,
    fresh: bool = False,
) -> Callable[[], QueueEntry]:
    """Idempotent: a job already queued keeps its row (and its bypass count). Returns what
    gives the row when called. `fresh`: the caller expects no row (a job just eligible), so
    the insert is tried first, its answer read only when the row is asked for (on a
    pipelined connection it travels with whatever is read before), and the row read only if
    one was there; otherwise it is read first."""
    known = None if fresh else queued(tx.session, uid)
    if known is not None:
        return lambda: known
    entry = QueueEntry(
        uid, name, pool, slots, -priority, eligible_at, bypass_count, node_name, dict(node_selector), cpu, memory
    )
    inserted = _ENQUEUE.execute(
        tx.session,
        {
            "job_uid": uid,
            "job_name": name,
            "pool": pool,
            "slots": slots,
            "rank": -priority,
            "eligible_at": eligible_at,
            "bypass_count": bypass_count,
            "node_name": node_name,
            "node_selector": json.dumps(node_selector, sort_keys=True),
            "cpu": cpu,
            "memory": memory,
        },
    )

    def row() -> QueueEntry:
        if inserted.rowcount:
            return entry
        found = queued(tx.session, uid)
        assert found is not None, "the queue row that the insert collided with is gone"
        return found

    return row


def dequeue(tx: Tx, uid: str) -> None:
    _DEQUEUE.execute(tx.session, {"uid": uid})


def queued(session: Connection, uid: str) -> QueueEntry | None:
    return queued_asked(session, uid)()


def queued_asked(session: Connection, uid: str) -> Callable[[], QueueEntry | None]:
    """`queued`, asked now and read when called."""
    result = _QUEUED.execute(session, {"uid": uid})

    def row() -> QueueEntry | None:
        found = result.first()
        return QueueEntry.from_row(found) if found else None

    return row


@functools.cache
def _line(scope_is_pool: bool, after: bool, batch: int) -> Statement:
    """A page of one scope's queue in admission order. Keyset paging (after the last row
    read) and a literal LIMIT: with a bound LIMIT or OFFSET, PostgreSQL's generic plan for a
    prepared statement cannot know the page is small and may sort the whole queue."""
    conditions = [c for c, on in (("pool = :pool", scope_is_pool), (_AFTER, after)) if on]
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return Statement(f"SELECT {_QUEUE} FROM queue{where} ORDER BY rank, eligible_at, job_uid LIMIT {int(batch)}")


_AFTER = "(rank, eligible_at, job_uid) > (:rank, :eligible_at, :uid)"


def in_line(session: Connection, pool: str | None, *, scope_is_pool: bool, batch: int = 16) -> Iterator[QueueEntry]:
    """The queue of one scope in admission order, read `batch` rows at a time as the caller
    goes on (most callers stop at the first entry or two). The first page is asked for at
    once, its answer read when the caller first looks: on a pipelined connection it travels
    with whatever is read before that."""
    first = _line(scope_is_pool, False, batch).execute(session, {"pool": pool})
    return _pages(session, pool, scope_is_pool, batch, first)


def _pages(
    session: Connection, pool: str | None, scope_is_pool: bool, batch: int, result: Result
) -> Iterator[QueueEntry]:
    while True:
        rows = result.all()
        yield from (QueueEntry.from_row(row) for row in rows)
        if len(rows) < batch:
            return
        last = rows[-1]
        params = {"pool": pool, "rank": last.rank, "eligible_at": last.eligible_at, "uid": last.job_uid}
        result = _line(scope_is_pool, True, batch).execute(session, params)


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
