"""Fault injection for crash tests: `RECONCILER_FAULT=<point>` makes the controller SIGKILL
itself when it reaches that point, as a crash there would. Unset, a point costs one dict
lookup."""

from __future__ import annotations

import os
import signal

POINTS = ("after-admission", "after-spawn", "before-exit-record", "during-backoff")
_ARMED = os.environ.get("RECONCILER_FAULT")


def point(name: str) -> None:
    if name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
