"""`controller --watch DIR`: apply and prune a folder on start and on every change, and again
while a change is refused for a reason that passes (a running job's spec: a conflict)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import Conflict, ReconcilerError
from .context import err

if TYPE_CHECKING:
    from ..store import Store

RETRY = 5.0  # seconds between applies of a folder whose last apply was a conflict


def owner_of(folder: str) -> str:
    """What marks the objects a watch of `folder` applied: its prune deletes only those
    (not what `apply`, `up` or a watch of another folder made in the same store)."""
    return f"watch:{Path(folder).resolve()}"


class Sync:
    """One folder's applies; what the last refusal said, so a retry does not say it again."""

    def __init__(self, store: Store, folder: str):
        self.store = store
        self.folder = folder
        self.said: list[str] = []
        self.retry_at: float | None = None  # when to apply again, unchanged: after a conflict

    def __call__(self) -> None:
        from ..apply import apply_manifests
        from ..manifests import read

        self.retry_at = None
        try:
            changes = apply_manifests(
                self.store, read([self.folder], recursive=True), prune=True, owner=owner_of(self.folder)
            )
        except ReconcilerError as exc:  # a bad commit must not stop the controller: report, keep the last good state
            lines = getattr(exc, "problems", None) or [str(exc)]
            if lines != self.said:
                for line in lines:
                    err(f"watch: {line}")
            self.said = lines
            if isinstance(exc, Conflict):  # e.g. a running job's spec: the folder wins once it ends
                self.retry_at = time.monotonic() + RETRY
            return
        self.said = []
        for c in changes:
            if c.action != "unchanged":
                err(f"watch: {c.kind.qualified}/{c.name} {c.action}")


def watch_folder(store: Store, folder: str, stop: threading.Event) -> None:
    from watchfiles import watch

    synced = Sync(store, folder)
    synced()  # at once: the folder's jobs go first
    # The watcher starts only when the loop first asks it for changes: a file written
    # between the sync above and that moment raises no event. Its first answer (a change,
    # or half a second of none) is followed by a sync in any case, which catches it.
    caught_up = False
    for changes in watch(
        folder, stop_event=stop, recursive=True, debounce=200, rust_timeout=500, yield_on_timeout=True
    ):
        retry = synced.retry_at is not None and time.monotonic() >= synced.retry_at
        if changes or not caught_up or retry:
            synced()
            caught_up = True
