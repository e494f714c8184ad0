"""Fault injection for crash tests: `RECONCILER_FAULT=<point>` makes the controller SIGKILL
itself when it reaches one of the KILLS (or INGEST_KILLS) points, as a crash there would, or makes the thread
that reaches one of the RAISES points raise, as a bug there would. Unset, a point costs one
comparison."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

KILLS = ("after-admission", "after-spawn", "before-exit-record", "during-backoff", "after-completion")
INGEST_KILLS = ("after-ingest",)  # a Source's batch stored, its messages not yet acknowledged
RAISES = ("worker-dies", "watcher-dies")
POINTS = KILLS + INGEST_KILLS + RAISES
_ARMED = os.environ.get("RECONCILER_FAULT")


class InjectedFault(RuntimeError):
    pass


def point(name: str, flush: Callable[[], None] | None = None) -> None:
    """`flush`: commit what the step wrote before the kill (a batch's open transaction), so
    that the crash comes where the point says, after those writes."""
    if name != _ARMED:
        return
    if name in RAISES:
        raise InjectedFault(f"fault injected at {name}")
    if flush is not None:
        flush()
    os.kill(os.getpid(), signal.SIGKILL)
