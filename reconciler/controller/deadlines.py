"""Deadlines as plain arithmetic on recorded times (seconds since the epoch)."""

from __future__ import annotations

from ..api.job import JobSpec


def job_deadline(spec: JobSpec, accepted_at: float) -> float | None:
    """The whole job: waits, queue, backoff and runs, from acceptance."""
    return None if spec.timeout is None else accepted_at + spec.timeout


def run_deadline(spec: JobSpec, started_at: float | None) -> float | None:
    return None if spec.run_timeout is None or started_at is None else started_at + spec.run_timeout


def wait_abort_deadline(spec: JobSpec, accepted_at: float) -> float | None:
    wait = spec.wait_for
    if wait is None:
        return None
    if wait.abort_at is not None:
        return wait.abort_at.timestamp()
    return None if wait.abort_after is None else accepted_at + wait.abort_after


def passed(deadline: float | None, now: float) -> bool:
    return deadline is not None and now >= deadline


def soonest(now: float, *times: float | None) -> float | None:
    """Seconds until the earliest future time among `times`, or None."""
    future = [t - now for t in times if t is not None]
    return max(0.0, min(future)) if future else None
