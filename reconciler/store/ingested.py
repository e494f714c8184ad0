"""The messages each Source turned into jobs: one row per (source, message id), written in the
transaction that stores the job, so a redelivered message (acknowledgement lost to a crash or a
broken connection) finds its job and creates nothing new. The job also carries the id as an
annotation; this table is the indexed lookup."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from .dbapi import Connection, Statement
from .transactions import Tx

_FIND = Statement("SELECT job FROM ingested WHERE source = :source AND message_id = :message_id")
_ADD = Statement(
    "INSERT INTO ingested (source, message_id, job, created_at) VALUES (:source, :message_id, :job, :created_at)"
)
_DROP = Statement("DELETE FROM ingested WHERE source = :source")
_COUNT = Statement("SELECT count(*) FROM ingested WHERE source = :source")


def job_of(session: Connection, source: str, message_id: str) -> str | None:
    """The job a message of the source already made, if any."""
    found = _FIND.execute(session, {"source": source, "message_id": message_id}).scalar()
    return None if found is None else str(found)


_AT_ONCE = 256


@functools.cache
def _find_many(width: int) -> Statement:
    marks = ", ".join(f":m{i}" for i in range(width))
    return Statement(f"SELECT message_id, job FROM ingested WHERE source = :source AND message_id IN ({marks})")


def jobs_of(session: Connection, source: str, message_ids: Iterable[str]) -> dict[str, str]:
    """message id -> job, of those of the ids the source already made a job of (a batch's
    lookup: one statement per 256 ids)."""
    wanted = sorted(set(message_ids))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), _AT_ONCE):
        chunk = wanted[start : start + _AT_ONCE]
        # 1, 2, 4 ... placeholders, the last id repeated: a few statements serve every count
        width = 1 << (len(chunk) - 1).bit_length()
        params = {f"m{i}": chunk[min(i, len(chunk) - 1)] for i in range(width)}
        found.update((r.message_id, r.job) for r in _find_many(width).execute(session, {"source": source, **params}))
    return found


def record(tx: Tx, source: str, made: Iterable[tuple[str, str]], now: float) -> None:
    """(message id, job) pairs made in this transaction."""
    _ADD.execute_values(tx.session, [(source, m, j, now) for m, j in made])


_FORGET = Statement("DELETE FROM ingested WHERE source = :source AND created_at < :cutoff")


def forget(tx: Tx, source: str, cutoff: float) -> int:
    """Drop what the source remembered of messages ingested before `cutoff`; how many."""
    return int(_FORGET.execute(tx.session, {"source": source, "cutoff": cutoff}).rowcount)


def drop(tx: Tx, source: str) -> None:
    """A deleted source: what it remembered goes (its jobs stay)."""
    _DROP.execute(tx.session, {"source": source})


def count(session: Connection, source: str) -> int:
    return int(_COUNT.execute(session, {"source": source}).scalar() or 0)
