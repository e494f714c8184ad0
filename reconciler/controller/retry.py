"""What happens after a run ends (API.md section 2, Retries), in the fixed order:
cancellation or job timeout; success; non-retryable outcome; retry limit; otherwise Backoff."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..api.job import MIN_RESTART_DELAY, Backoff, Restart, Retry
from ..api.quantity import format_left


@dataclass(frozen=True)
class RunEnd:
    outcome: str  # Succeeded | Failed | TimedOut | Cancelled | StartFailed | Lost
    exit_code: int | None = None
    # why a run was Lost (ProcessLost, NodeLost), could not start, or failed (OOMKilled): the job's reason
    reason: str | None = None
    retryable: bool = False  # a StartFailed run worth another attempt (its artifact's URL was unreachable)


@dataclass(frozen=True)
class AfterRun:
    retry: bool
    outcome: str | None = None  # the job's outcome when not retrying
    reason: str | None = None
    message: str = ""
    delay: float = 0.0  # before the next attempt, when retrying


def backoff_delay(backoff: Backoff, retry_number: int, rand: Callable[[], float]) -> float:
    """Delay before retry `retry_number` (1 = first retry): capped, then +- jitter/2."""
    n = max(1, retry_number)
    if backoff.policy == "constant":
        base = backoff.delay
    elif backoff.policy == "linear":
        base = backoff.delay * n
    else:
        try:
            base = backoff.delay * backoff.factor ** (n - 1)
        except OverflowError:  # a large factor at a high retry number: the cap applies anyway
            base = float("inf")
    capped = min(base, backoff.max_delay)
    return max(0.0, capped + (rand() - 0.5) * backoff.jitter)


@dataclass(frozen=True)
class RestartDelay:
    delay: float
    crash_loop: bool  # the run that ended lived shorter than resetAfter
    streak: int  # runs in a row, ending with this one, that lived shorter than resetAfter


def restart_delay(restart: Restart, lifetimes: list[float]) -> RestartDelay:
    """A service's delay before its next run, from how long its runs of this revision
    lived (oldest first, the one that just ended last): `delay`, doubled for each run in a
    row that lived shorter than `resetAfter`, capped at `maxDelay`. A run that lived
    `resetAfter` resets it, as Kubernetes resets a container's crash-loop backoff."""
    restart = restart.model_copy(  # a spec stored before apply refused a delay of 0 still backs off
        update={"delay": max(restart.delay, MIN_RESTART_DELAY), "max_delay": max(restart.max_delay, MIN_RESTART_DELAY)}
    )
    streak = 0
    for lived in reversed(lifetimes):
        if lived >= restart.reset_after:
            break
        streak += 1
    if streak == 0:
        return RestartDelay(min(restart.delay, restart.max_delay), False, 0)
    try:
        base = restart.delay * 2 ** (streak - 1)
    except OverflowError:  # a long streak: the cap applies anyway
        base = float("inf")
    return RestartDelay(min(base, restart.max_delay), True, streak)


def _retryable(retry: Retry, run: RunEnd) -> tuple[bool, str, str]:
    """(retryable, job outcome if not, reason if not)."""
    if run.outcome == "Failed":
        ok = not retry.on_exit_codes or run.exit_code in retry.on_exit_codes
        return ok, "Failed", run.reason or "NonRetryableExitCode"
    if run.outcome == "TimedOut":
        return retry.on_timeout, "TimedOut", "RunTimeout"
    if run.outcome == "Lost":
        return retry.on_lost, "Lost", run.reason or "NodeLost"
    if run.outcome == "StartFailed":
        return run.retryable, "Failed", run.reason or "StartFailed"
    return False, run.outcome, run.outcome


def after_run(
    retry: Retry,
    run: RunEnd,
    *,
    attempts: int,
    cancelled: bool,
    deadline_passed: bool,
    rand: Callable[[], float],
    restart: float | None = None,
    number: int | None = None,
) -> AfterRun:
    """`attempts` counts runs of this revision including the one that just ended; `number`
    is that run's own number, which messages name (runs are numbered across revisions: after
    a rerun the first attempt is run 2, not run 1; default: `attempts`). `restart`
    is a service's restart delay: a service is restarted after every end but a failed
    start (never counted against retry.limit) until it is cancelled."""
    if cancelled:
        return AfterRun(False, "Cancelled", "Cancelled", "the job was cancelled")
    if deadline_passed:
        return AfterRun(False, "TimedOut", "DeadlineExceeded", "the job exceeded its timeout")
    if restart is not None and (run.outcome != "StartFailed" or run.retryable):
        message = f"service run ended {run.outcome}; restarting in {format_left(restart)}"
        return AfterRun(True, delay=restart, message=message)
    if run.outcome == "Succeeded":
        return AfterRun(False, "Succeeded", None, "the run exited 0")
    ok, outcome, reason = _retryable(retry, run)
    detail = f"run {attempts if number is None else number} ended {run.outcome}" + (
        f" with exit code {run.exit_code}" if run.exit_code is not None else ""
    )
    if not ok:
        return AfterRun(False, outcome, reason, f"{detail}; not retryable")
    if attempts > retry.limit:
        if retry.limit > 0:
            # retries were used up: as a Kubernetes Job's, that is why the job ended, whatever
            # ended its last run (whose reason stays on its record and in the message), and
            # the reason tells a retryable end at the limit from one never retried
            why = f" ({run.reason})" if run.reason else ""
            return AfterRun(False, outcome, "BackoffLimitExceeded", f"{detail}{why}; retry limit {retry.limit} reached")
        # none was allowed: the run's own reason says what happened (OOMKilled, RunTimeout, ...)
        reason = run.reason or "BackoffLimitExceeded" if run.outcome == "Failed" else reason
        return AfterRun(False, outcome, reason, f"{detail}; retry limit {retry.limit} reached")
    delay = backoff_delay(retry.backoff, attempts, rand)
    return AfterRun(True, delay=delay, message=f"{detail}; retry {attempts} of {retry.limit} in {format_left(delay)}")
