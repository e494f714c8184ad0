"""The messages each Source turned into jobs: one row per (source, message id), written in the
transaction that stores the job, so a redelivered message (acknowledgement lost to a crash or a
broken connection) finds its job and creates nothing new. The job also carries the id as an
annotation; this table is the indexed lookup."""

from __future__ import annotations

from collections.abc import Iterable

from .dbapi import Connection, Statement
from .engine import Tx

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


def record(tx: Tx, source: str, made: Iterable[tuple[str, str]], now: float) -> None:
    """(message id, job) pairs made in this transaction."""
    rows = [{"source": source, "message_id": m, "job": j, "created_at": now} for m, j in made]
    _ADD.execute_rows(tx.session, rows)


def drop(tx: Tx, source: str) -> None:
    """A deleted source: what it remembered goes (its jobs stay)."""
    _DROP.execute(tx.session, {"source": source})


def count(session: Connection, source: str) -> int:
    return int(_COUNT.execute(session, {"source": source}).scalar() or 0)
