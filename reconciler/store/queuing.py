"""The queue: a row per job stored Queued, in admission order `(-priority, eligibleAt, uid)`
with its durable bypass count. Each scope's line (the global limit, a pool) is read a page
at a time; an insert and a first page are asked for at once and answered when read, so on a
pipelined connection they travel with whatever is read before."""

from __future__ import annotations

import bisect
import functools
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..jsontext import parse
from .dbapi import Connection, Result, Row, Statement
from .transactions import Epoch, Tx

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
    tx.writes(QUEUE)
    known = None if fresh else queued(tx.session, uid)
    if known is not None:
        return lambda: known
    tx.rv()  # a queue write moves the change sequence (QUEUE)
    entry = QueueEntry(
        uid, name, pool, slots, -priority, eligible_at, bypass_count, node_name, dict(node_selector), cpu, memory
    )
    _heads_enqueued(tx.memo, pool, (-priority, eligible_at, uid, name))
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
    tx.writes(QUEUE)
    tx.rv()
    for heads in _heads(tx.memo).values():
        heads.keys = [key for key in heads.keys if key[2] != uid]
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


def first_in_line(session: Connection, pool: str | None, limit: int, epoch: object | None = None) -> list[str]:
    """Names of the first `limit` queued jobs of a scope: who to wake when slots free up.
    With the reader's batch `epoch` (`Store.epoch`), the scope's first HEADS entries are kept
    in it as read and as its own writes then change them, and read again only once too few
    are left: a release of slots (one a job on the burn-down over agents) asks no round trip."""
    scope_is_pool = pool is not None
    if not isinstance(epoch, Epoch) or limit > HEADS:
        line = in_line(session, pool, scope_is_pool=scope_is_pool, batch=min(max(limit, 1), 64))
        return [entry.name for entry in itertools.islice(line, limit)]
    kept = _heads(epoch.memo)
    heads = kept.get(pool)
    if heads is None or (len(heads.keys) < limit and not heads.whole):
        entries = list(itertools.islice(in_line(session, pool, scope_is_pool=scope_is_pool, batch=HEADS), HEADS))
        keys = [(e.rank, e.eligible_at, e.uid, e.name) for e in entries]
        heads = kept[pool] = _Heads(keys, whole=len(entries) < HEADS)
    return [key[3] for key in heads.keys[:limit]]


def count_bypass(tx: Tx, uid: str) -> None:
    tx.writes(QUEUE)
    tx.rv()
    _COUNT_BYPASS.execute(tx.session, {"uid": uid})


# The queue's heads kept per batch epoch (first_in_line): an epoch-safe transaction may not
# write the queue (transactions.KEPT_KINDS), and every queue write moves the change sequence
# (even one that commits no object), so only this thread's writes change it meanwhile.
QUEUE = "Queue"
HEADS = 64  # entries of a scope's line kept


@dataclass(slots=True)
class _Heads:
    """The first entries of one scope's line, as (rank, eligible_at, uid, name) in line order;
    `whole`: the line has no more."""

    keys: list[tuple[int, float, str, str]]
    whole: bool


def _heads(memo: dict[str, Any]) -> dict[str | None, _Heads]:
    """Each scope's kept heads (None: the global line), in an epoch's memo."""
    found: dict[str | None, _Heads] = memo.setdefault("queue-heads", {})
    return found


def _heads_enqueued(memo: dict[str, Any], pool: str | None, key: tuple[int, float, str, str]) -> None:
    """An insert into the lines of the global scope and the job's pool (it does nothing where
    the job has a row already): placed among the kept heads where that is certain, the heads
    dropped where it is not. A row of the job's is certainly absent when the global line is
    kept whole without it; and a tie with a kept entry on rank and time is left to the
    database, whose collation orders the uids."""
    kept = _heads(memo)
    if any(k[2] == key[2] for heads in kept.values() for k in heads.keys):
        return  # queued already: that row stays where it is
    whole = kept.get(None)
    absent = whole is not None and whole.whole
    for scope in {None, pool}:
        heads = kept.get(scope)
        if heads is None or (not heads.whole and heads.keys and key[:2] > heads.keys[-1][:2]):
            continue  # not kept, or its place is past the kept ones
        if heads.whole and absent and all(k[:2] != key[:2] for k in heads.keys):
            bisect.insort(heads.keys, key)
        else:
            del kept[scope]
