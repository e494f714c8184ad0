"""Removing the folders of runs nobody will ask for again (their job deleted, or a
service's oldest runs, whose records status no longer keeps), in a thread of its own: a
folder may hold a run's logs up to twice its logLimit, and an unpacked artifact, which are
not the reconcile loop's to wait for. A crash before a removal leaves the folder, no more."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class FolderRemover:
    def __init__(self) -> None:
        # a folder, or (a folder, a name prefix): every entry of it whose name starts so
        self._todo: queue.SimpleQueue[Path | tuple[Path, str] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def remove(self, folders: list[Path]) -> None:
        for folder in folders:
            self._put(folder)

    def remove_named(self, parent: Path, prefix: str) -> None:
        """Every folder in `parent` whose name starts with `prefix` (looked for off the caller's
        thread: the parent may hold thousands)."""
        self._put((parent, prefix))

    def _put(self, work: Path | tuple[Path, str]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="run-folders", daemon=True)
                self._thread.start()
        self._todo.put(work)

    def close(self, timeout: float = 5.0) -> None:
        """Stop once the removals asked for are done (for up to `timeout`)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._todo.put(None)
            thread.join(timeout)

    def _run(self) -> None:
        while (work := self._todo.get()) is not None:
            if isinstance(work, Path):
                remove_tree(work)
                continue
            parent, prefix = work
            try:
                with os.scandir(parent) as entries:
                    named = [Path(e.path) for e in entries if e.name.startswith(prefix)]
            except OSError:
                named = []
            for folder in named:
                remove_tree(folder)


def remove_tree(folder: Path) -> None:
    """Remove a folder and all in it, now, read-only folders a run made in it too; one that
    cannot be is left, with a warning."""
    try:
        if sys.version_info >= (3, 12):
            shutil.rmtree(folder, onexc=_writable_again)
        else:
            shutil.rmtree(folder, onerror=lambda func, path, info: _writable_again(func, path, info[1]))
    except FileNotFoundError:
        pass
    except OSError as exc:  # left on the disk: nothing depends on its removal
        log.warning("the run folder %s could not be removed: %s", folder, exc)


def _writable_again(func: Callable[..., Any], path: str, exc: BaseException) -> None:
    """An entry of a folder the run made read-only (as Go's module cache is, for one) cannot be
    removed by a process that is not root, whoever owns it: the folder is made its owner's to
    write again, and the removal tried once more."""
    if not isinstance(exc, PermissionError) or func not in (os.unlink, os.rmdir):
        raise exc
    os.chmod(os.path.dirname(path), 0o700)
    func(path)
