"""`controller --watch DIR`: apply and prune a folder on start and on every change."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..errors import ReconcilerError
from .context import err

if TYPE_CHECKING:
    from ..store import Store


def sync(store: Store, folder: str) -> None:
    from ..apply import apply_manifests
    from ..manifests import read

    try:
        changes = apply_manifests(store, read([folder], recursive=True), prune=True)
    except ReconcilerError as exc:  # a bad commit must not stop the controller: report, keep the last good state
        for line in getattr(exc, "problems", None) or [str(exc)]:
            err(f"watch: {line}")
        return
    for c in changes:
        if c.action != "unchanged":
            err(f"watch: {c.kind.qualified}/{c.name} {c.action}")


def watch_folder(store: Store, folder: str, stop: threading.Event) -> None:
    from watchfiles import watch

    sync(store, folder)  # at once: the folder's jobs go first
    # The watcher starts only when the loop first asks it for changes: a file written
    # between the sync above and that moment raises no event. Its first answer (a change,
    # or half a second of none) is followed by a sync in any case, which catches it.
    caught_up = False
    for changes in watch(
        folder, stop_event=stop, recursive=True, debounce=200, rust_timeout=500, yield_on_timeout=True
    ):
        if changes or not caught_up:
            sync(store, folder)
            caught_up = True
