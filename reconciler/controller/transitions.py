"""The one table of allowed phase transitions. No code sets `status.phase` by hand: it calls
`move`, which checks the table, stamps reason/message/outcome/conditions, and returns the
event to record in the same transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALLOWED: dict[str, frozenset[str]] = {
    "Waiting": frozenset({"Queued", "Suspended", "Completed"}),
    "Queued": frozenset({"Starting", "Suspended", "Completed", "Waiting"}),
    "Starting": frozenset({"Running", "Stopping", "Backoff", "Completed", "Queued", "Suspended", "Waiting"}),
    "Running": frozenset({"Stopping", "Backoff", "Completed"}),
    "Stopping": frozenset({"Backoff", "Suspended", "Completed", "Waiting"}),
    "Backoff": frozenset({"Queued", "Suspended", "Completed", "Waiting"}),
    "Suspended": frozenset({"Waiting", "Queued", "Backoff", "Completed"}),
    "Completed": frozenset({"Waiting"}),  # a new revision
}

HOLDING_SLOTS = frozenset({"Starting", "Running", "Stopping"})
WARNING_OUTCOMES = frozenset({"Failed", "TimedOut", "Aborted", "Lost"})


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


def _condition(status: dict[str, Any], type_: str, value: bool, reason: str, message: str, now: str) -> None:
    conditions = status.setdefault("conditions", [])
    text = "True" if value else "False"
    for c in conditions:
        if c["type"] == type_:
            if c["status"] != text:
                c["lastTransitionTime"] = now
            c.update(status=text, reason=reason, message=message)
            return
    conditions.append({"type": type_, "status": text, "reason": reason, "message": message, "lastTransitionTime": now})


def move(
    status: dict[str, Any],
    to: str,
    *,
    reason: str,
    message: str,
    now: str,
    outcome: str | None = None,
    event_reason: str | None = None,
) -> Event:
    """Change `status` in place from its phase to `to`; the caller writes it once."""
    current = status.get("phase", "Waiting")
    if (to != current and to not in ALLOWED[current]) or to == current == "Completed":
        raise IllegalTransition(f"{current} -> {to} is not an allowed transition ({reason})")
    if (to == "Completed") != (outcome is not None):
        raise IllegalTransition("an outcome is given exactly when the job completes")
    status["phase"] = to
    status["reason"] = reason
    status["message"] = message
    status["outcome"] = outcome
    if to == "Completed":
        status["completionTime"] = now
        status.pop("nextRunAt", None)
        _condition(status, "Completed", True, outcome, message, now)
        _condition(status, "Succeeded", outcome == "Succeeded", reason, message, now)
    admitted = to in HOLDING_SLOTS
    if admitted != (current in HOLDING_SLOTS) or to == "Starting":
        _condition(
            status,
            "Admitted",
            admitted,
            "SlotsGranted" if admitted else "SlotsReleased",
            message if admitted else "",
            now,
        )
    warning = outcome in WARNING_OUTCOMES
    return Event(event_reason or (outcome if to == "Completed" else reason), message, warning)
