"""Wait conditions (API.md 1.1 waitFor). Checks of the outside world (a path, a probe) are
passed in as functions, so the combining logic is pure and tested from tables."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..api.job import WaitCondition, WaitFor
from ..api.meta import from_epoch
from ..api.quantity import format_duration
from ..api.status import WaitDict

PATH_POLL = 1.0  # default interval for path conditions


@dataclass(frozen=True)
class Check:
    type: str
    satisfied: bool
    message: str
    fatal: bool = False  # a probe with fatalOnError failed
    recheck_in: float | None = None  # seconds until this condition may change


# A probe's current verdict, or None before its first probe ended (whoever runs the probes
# wakes the job when one ends)
ProbeRunner = Callable[[WaitCondition], "tuple[bool, str] | None"]


def check_path(path: str, kind: str | None) -> tuple[bool, str]:
    if kind == "dir":
        return (True, f"{path} is a directory") if os.path.isdir(path) else (False, f"{path} is not a directory")
    if kind == "file":
        return (True, f"{path} is a file") if os.path.isfile(path) else (False, f"{path} is not a file")
    return (True, f"{path} exists") if os.path.exists(path) else (False, f"{path} does not exist")


def check(
    cond: WaitCondition,
    *,
    accepted_at: float,
    now: float,
    probe: ProbeRunner,
    path_check: Callable[[str, str | None], tuple[bool, str]] = check_path,
) -> Check:
    if cond.until is not None:
        at = cond.until.timestamp()
        ok = now >= at
        message = "time reached" if ok else f"until {cond.until.isoformat()}"
        return Check("until", ok, message, recheck_in=None if ok else at - now)
    if cond.delay is not None:
        at = accepted_at + cond.delay
        ok = now >= at
        # its end, not a countdown: the message stays the same while it waits, so an unchanged
        # result is not written again (job.py `_record_waits`)
        message = "delay elapsed" if ok else f"delay of {format_duration(cond.delay)} until {from_epoch(at)}"
        return Check("delay", ok, message, recheck_in=None if ok else at - now)
    if cond.path is not None:
        ok, message = path_check(cond.path, cond.type)
        return Check("path", ok, message, recheck_in=None if ok else (cond.interval or PATH_POLL))
    assert cond.probe is not None  # a condition is exactly one of the four (api/job.py)
    answer = probe(cond)
    if answer is None:  # the first probe runs: its end wakes the job, no timer needed
        return Check("probe", False, "probe running")
    ok, message = answer
    fatal = not ok and cond.probe.fatal_on_error
    return Check("probe", ok, message, fatal=fatal, recheck_in=None if ok else cond.probe.interval)


def gate(wait_for: WaitFor | None, checks: list[Check]) -> bool:
    if wait_for is None or not wait_for.conditions:
        return True
    results = [c.satisfied for c in checks]
    return all(results) if wait_for.mode == "all" else any(results)


def evaluate(
    wait_for: WaitFor | None,
    *,
    accepted_at: float,
    now: float,
    probe: ProbeRunner,
    previous: Sequence[WaitDict] | None = None,
) -> list[Check]:
    """Check each condition; in `all` mode a condition already satisfied stays satisfied
    (waits gate the first run only and a file may be consumed once seen)."""
    if wait_for is None:
        return []
    previous = previous or []
    done = {i for i, w in enumerate(previous) if w.get("satisfied")}
    checks = []
    for i, cond in enumerate(wait_for.conditions):
        if i in done and wait_for.mode == "all":
            prev = previous[i]
            checks.append(Check(prev["type"], True, prev.get("message") or "satisfied"))
        else:
            checks.append(check(cond, accepted_at=accepted_at, now=now, probe=probe))
    return checks
