"""Ending the process when it must not go on.

Threads the controller cannot live without (reconcile workers, the change watcher, the
exit watcher, the path watcher, probe runners) are started here. If one dies, the process
must not live on with its heartbeat beating and nothing reconciled, where no other
controller takes over and nobody notices: it exits with status 1 and one line saying why,
so that a supervisor restarts it, and the restarted controller adopts what was running
(kill -9 at any point is survivable by design)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("reconciler")

EXIT_STATUS = 1


def critical(name: str, target: Callable[[], None]) -> threading.Thread:
    """A daemon thread running `target`; if `target` raises, the process ends."""

    def body() -> None:
        try:
            target()
        except BaseException as exc:
            die(name, exc)

    return threading.Thread(target=body, name=name, daemon=True)


def die(name: str, exc: BaseException) -> None:
    """End the process now: a thread it cannot work without is gone."""
    fatal(f"thread {name} died ({type(exc).__name__}: {exc}); exiting so that a supervisor restarts it", exc)


def fatal(message: str, exc: BaseException | None = None) -> None:
    """End the process now, with status 1 and one line saying why."""
    log.critical(message, exc_info=exc)
    try:
        print(f"reconciler: {message}", file=sys.stderr, flush=True)
    finally:
        os._exit(EXIT_STATUS)
