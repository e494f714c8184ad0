"""The one table of allowed phase transitions. No code sets `status.phase` by hand: it calls
`move`, which checks the table, stamps reason/message/outcome/conditions, and returns the
event to record in the same transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..api.meta import to_epoch
from ..api.status import LIVE_PHASES, WARNING_OUTCOMES, ConditionDict, JobStatusDict, Phase, phase_of

P = Phase

ALLOWED: dict[Phase, frozenset[Phase]] = {
    P.WAITING: frozenset({P.QUEUED, P.SUSPENDED, P.COMPLETED}),
    P.QUEUED: frozenset({P.STARTING, P.SUSPENDED, P.COMPLETED, P.WAITING}),
    P.STARTING: frozenset({P.RUNNING, P.STOPPING, P.BACKOFF, P.COMPLETED, P.QUEUED, P.SUSPENDED, P.WAITING}),
    # Running with no run alive is a service between runs (nextRunAt): it starts its next
    # run in place, or a stop asked for meanwhile ends it as it would end a stopped run.
    P.RUNNING: frozenset({P.STOPPING, P.BACKOFF, P.COMPLETED, P.STARTING, P.SUSPENDED, P.WAITING}),
    P.STOPPING: frozenset({P.BACKOFF, P.SUSPENDED, P.COMPLETED, P.WAITING, P.RUNNING}),
    P.BACKOFF: frozenset({P.QUEUED, P.SUSPENDED, P.COMPLETED, P.WAITING}),
    P.SUSPENDED: frozenset({P.WAITING, P.QUEUED, P.BACKOFF, P.COMPLETED}),
    P.COMPLETED: frozenset({P.WAITING}),  # a new revision
}


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


def set_condition(status: JobStatusDict, type_: str, value: bool, reason: str, message: str, now: str) -> None:
    conditions = status.setdefault("conditions", [])
    text: Literal["True", "False"] = "True" if value else "False"
    for c in conditions:
        if c["type"] == type_:
            if c["status"] != text:
                c["lastTransitionTime"] = now
            c["status"], c["reason"], c["message"] = text, reason, message
            return
    condition: ConditionDict = {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }
    conditions.append(condition)


def move(
    status: JobStatusDict,
    to: Phase,
    *,
    reason: str,
    message: str,
    now: str,
    outcome: str | None = None,
    event_reason: str | None = None,
) -> Event:
    """Change `status` in place from its phase to `to`; the caller writes it once."""
    current = phase_of(status)
    if (to != current and to not in ALLOWED[current]) or to == current == Phase.COMPLETED:
        raise IllegalTransition(f"{current} -> {to} is not an allowed transition ({reason})")
    if (to == Phase.COMPLETED) != (outcome is not None):
        raise IllegalTransition("an outcome is given exactly when the job completes")
    if to == Phase.SUSPENDED and current != Phase.SUSPENDED:
        status["suspendedAt"] = now  # the job timeout's clock stops (Ctx.job_deadline)
    elif current == Phase.SUSPENDED and to != Phase.SUSPENDED and "suspendedAt" in status:
        paused = to_epoch(now) - to_epoch(status.pop("suspendedAt"))
        status["suspendedSeconds"] = round(status.get("suspendedSeconds", 0.0) + max(0.0, paused), 3)
    status["phase"] = to
    status["reason"] = reason
    status["message"] = message
    status["outcome"] = outcome
    if outcome is not None:
        status["completionTime"] = now
        status.pop("nextRunAt", None)
        set_condition(status, "Completed", True, outcome, message, now)
        set_condition(status, "Succeeded", outcome == "Succeeded", reason, message, now)
    admitted = to in LIVE_PHASES
    if admitted != (current in LIVE_PHASES) or to == Phase.STARTING:
        set_condition(
            status,
            "Admitted",
            admitted,
            "SlotsGranted" if admitted else "SlotsReleased",
            message if admitted else "",
            now,
        )
    warning = outcome in WARNING_OUTCOMES
    return Event(event_reason or (outcome if outcome is not None else reason), message, warning)
