"""Why a job waits, in one sentence: the words `describe`, `get -o wide` and the dashboard
all use, so the three never disagree. Pure: a job's spec and its status as reads.py shows
it (with the `queue` entry it adds to a Queued job: the position in its pool's line and
the scope that is full, read at that moment)."""

from __future__ import annotations

from typing import Any

from .api.status import Phase, phase_of


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def line_name(pool: str | None) -> str:
    """The line a job queues in: its pool's, or the global one (a job without a pool)."""
    return f"pool {pool}" if pool else "the global queue"


def scope_name(scope: str, name: str) -> str:
    return "the global limit" if scope == "global" else f"{scope} {name}"


def why_waiting(spec: dict[str, Any], status: dict[str, Any] | None) -> str | None:
    """Why a job that has not started yet (or is between runs) waits, or None when it does
    not wait (it is starting, running, stopping or completed)."""
    status = status or {}
    phase = phase_of(status)
    if phase == Phase.WAITING:
        return _unmet(spec, status) or "not evaluated yet: the controller has not looked at it"
    if phase == Phase.QUEUED:
        return _queued(status)
    if phase == Phase.BACKOFF:
        at = status.get("nextRunAt")
        runs = status.get("runs") or []
        after = f" after run {runs[-1]['number']}" if runs else ""
        return f"backing off{after}: runs again at {at}" if at else f"backing off{after}"
    if phase == Phase.SUSPENDED:
        return "suspended: resume it to go on"
    return None


def _unmet(spec: dict[str, Any], status: dict[str, Any]) -> str:
    """Each dependency without a satisfying receipt, then each wait condition not met."""
    satisfied = {r["job"] for r in status.get("dependencies") or [] if r.get("satisfied")}
    said = []
    for dep in spec.get("dependsOn") or []:
        if dep["job"] in satisfied:
            continue
        outcomes = dep.get("outcomes") or ["Succeeded"]
        needs = "to succeed" if outcomes == ["Succeeded"] else "to end " + " or ".join(outcomes)
        said.append(f"dependency {dep['job']} has yet {needs}")
    for wait in status.get("waits") or []:
        if not wait.get("satisfied"):
            message = wait.get("message") or "not met"
            said.append(f"wait {wait.get('type')} unmet: {message}")
    return "; ".join(said)


def _queued(status: dict[str, Any]) -> str:
    """Its place in line, then what holds it: a full pool or global limit, no node that fits,
    or an older job that goes first."""
    queue = status.get("queue")
    place = f"{ordinal(queue['position'])} of {queue['length']} in {line_name(queue.get('pool'))}" if queue else ""
    reason, message = status.get("reason"), status.get("message") or ""
    full = (queue or {}).get("full")
    if reason == "Unschedulable":
        held = f"no node fits: {message}"
    elif full:
        where = scope_name(full["scope"], full["name"])
        held = f"{where} is full ({full['used']}/{full['capacity']} slots in use, {full['needed']} needed)"
    elif reason in ("WaitingForTurn", "BypassLimit"):
        held = message
    else:
        held = "waiting for admission"
    return f"{place}; {held}" if place else held
