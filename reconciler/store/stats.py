"""What the metrics count at scrape time, each one index-only query over
`ix_objects_state` or the admissions table, however many jobs the store holds."""

from __future__ import annotations

from .dbapi import Connection, Statement

_JOBS = Statement("SELECT phase, outcome, count(*) AS n FROM objects WHERE kind = 'Job' GROUP BY phase, outcome")
_PENDING = Statement(
    "SELECT phase, pool, reason, count(*) AS n FROM objects WHERE kind = 'Job'"
    " AND phase IN ('Waiting', 'Queued', 'Backoff') GROUP BY phase, pool, reason"
)


def jobs_by_state(session: Connection) -> list[tuple[str | None, str | None, int]]:
    """(phase, outcome, jobs)."""
    return [(row.phase, row.outcome, int(row.n)) for row in _JOBS.execute(session)]


def pending_jobs(session: Connection) -> list[tuple[str, str | None, str | None, int]]:
    """(phase, pool, reason, jobs) of the jobs that wait: Waiting, Queued or Backoff."""
    return [(row.phase, row.pool, row.reason, int(row.n)) for row in _PENDING.execute(session)]
