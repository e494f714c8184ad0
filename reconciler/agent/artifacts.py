"""A job's artifact unpacked into a fresh folder per run, beside the reconcile loop: the zip
comes from the cache (artifactcache.py, fetched once per sha256 under the state dir).

`Artifacts` runs this in a few threads of its own (fetches, then unpacking and removal), so
a step of the reconcile loop only asks and never waits: `prepare` answers at once (started,
pending, ready, failed) and the job is woken when its preparation ends."""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..files import make_private_dirs
from ..threads import critical
from .artifactcache import CACHE, Cache, FetchLimits, shown
from .logs import WORK
from .unzip import TEMP_PREFIX, ArtifactError, UnpackLimits, remove_tree, unpack

log = logging.getLogger(__name__)

FETCH_THREADS = 4  # downloads at once; more wait their turn
DISK_THREADS = 2  # unpacking and removing run folders
CLOSE_TIMEOUT = 5.0  # how long close() carries out the removals still queued


# -- preparing runs beside the loop ------------------------------------------------------
@dataclass(frozen=True)
class Preparation:
    """Where a run's artifact stands. `started`: this call asked for it; `pending`: it is
    being fetched or unpacked; `ready`: unpacked into the run's folder; `failed`: with the
    message, the reason (ArtifactInvalid, or StartFailed when the machine is at fault) and
    whether a later attempt may succeed."""

    state: Literal["started", "pending", "ready", "failed"]
    message: str = ""
    reason: str = "ArtifactInvalid"
    retryable: bool = False


_STARTED, _PENDING, _READY = Preparation("started"), Preparation("pending"), Preparation("ready")
Source = tuple[str, str | None]  # (url, sha256): runs asking for the same one share a fetch
_DiskWork = tuple[Path, "_Prep | None", "Path | None"]  # (run dir, unpack this prep from this zip | remove)


@dataclass
class _Prep:
    job: str
    run_dir: Path
    result: Preparation | None = None


class Artifacts:
    """Fetches artifacts and unpacks them into runs' folders in threads of its own (started
    on first use), and wakes the job when its run's folder is ready or cannot be."""

    def __init__(
        self,
        state_dir: Path,
        wake: Callable[[str], None],
        *,
        fetch_limits: FetchLimits | None = None,
        unpack_limits: UnpackLimits | None = None,
    ):
        self.cache = Cache(Path(state_dir) / CACHE, fetch_limits)
        self.unpack_limits = unpack_limits or UnpackLimits()
        self._wake = wake
        self._lock = threading.Lock()
        self._runs: dict[Path, _Prep] = {}
        self._fetching: dict[Source, list[_Prep]] = {}  # in flight in this process, and who waits for it
        self._fetches: queue.SimpleQueue[Source | None] = queue.SimpleQueue()
        # one queue a disk thread, a run's work always on the same one: its folder's removal
        # and a later unpacking into it (a drained admission's run number comes back) never overlap
        self._disk: list[queue.SimpleQueue[_DiskWork | None]] = [queue.SimpleQueue() for _ in range(DISK_THREADS)]
        self._threads: list[threading.Thread] = []
        self._closed = False

    def prepare(self, job: str, run_dir: Path, url: str, sha256: str | None) -> Preparation:
        """Answers at once. A run's preparation starts on the first call; its end (ready or
        failed) is answered once, then forgotten."""
        with self._lock:
            prep = self._runs.get(run_dir)
            if prep is None:
                if self._closed:
                    return _PENDING
                self._start()
                prep = self._runs[run_dir] = _Prep(job, run_dir)
                source = (url, sha256)
                waiting = self._fetching.get(source)
                if waiting is None:
                    self._fetching[source] = [prep]
                    self._fetches.put(source)
                else:
                    waiting.append(prep)
                return _STARTED
            if prep.result is None:
                return _PENDING
            del self._runs[run_dir]
            return prep.result

    def preparing(self, run_dir: Path) -> bool:
        """A preparation of this run is known here and not yet answered ready or failed."""
        with self._lock:
            return run_dir in self._runs

    def discard(self, run_dir: Path) -> None:
        """The run is over, or will never start: forget its preparation and remove its
        unpacked folder (in the background: a folder may be large)."""
        with self._lock:
            prep = self._runs.pop(run_dir, None)
            if prep is None and not os.path.lexists(os.path.join(run_dir, WORK)):
                return  # the common case, a run without an artifact: one stat
            if not self._closed:
                self._start()
                self._disk_for(run_dir).put((run_dir, None, None))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop: fetches in flight are left to end by themselves (their threads are daemons),
        unpacking not begun is dropped (the next controller prepares again), and the
        removals of ended runs' folders still queued are carried out, for up to `timeout`
        seconds: a process that exits right after (`up`) would leave them behind."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            for _ in range(FETCH_THREADS if threads else 0):
                self._fetches.put(None)
            for disk in self._disk if threads else []:
                disk.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads[FETCH_THREADS:]:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _start(self) -> None:  # under the lock
        if not self._threads:
            self._threads = [critical(f"artifact-fetch-{i}", self._fetch_loop) for i in range(FETCH_THREADS)]
            self._threads += [
                critical(f"artifact-unpack-{i}", functools.partial(self._disk_loop, disk))
                for i, disk in enumerate(self._disk)
            ]
            for thread in self._threads:
                thread.start()

    def _fetch_loop(self) -> None:
        while (source := self._fetches.get()) is not None:
            path, failure = None, None
            try:
                path = self.cache.get(*source)
            except ArtifactError as exc:
                failure = Preparation("failed", str(exc), exc.reason, exc.retryable)
            except Exception as exc:  # a fetch that cannot run is a failed run, not a dead thread
                log.warning("fetching artifact %s failed", shown(source[0]), exc_info=True)
                failure = Preparation("failed", f"cannot fetch the artifact {shown(source[0])}: {exc}", "StartFailed")
            with self._lock:
                waiting = self._fetching.pop(source, [])
            for prep in waiting:
                if failure is not None:
                    self._done(prep, failure)
                else:
                    self._disk_for(prep.run_dir).put((prep.run_dir, prep, path))

    def _disk_for(self, run_dir: Path) -> queue.SimpleQueue[_DiskWork | None]:
        return self._disk[hash(run_dir) % len(self._disk)]

    def _disk_loop(self, disk: queue.SimpleQueue[_DiskWork | None]) -> None:
        while (item := disk.get()) is not None:
            run_dir, prep, archive = item
            if prep is None or archive is None:
                _clear(run_dir)
                continue
            with self._lock:
                if self._runs.get(run_dir) is not prep or self._closed:
                    continue  # discarded while its fetch ran, or stopping
            try:
                make_private_dirs(run_dir)
                _clear(run_dir)  # what an earlier attempt at this run left (a crash)
                unpack(archive, run_dir / WORK, self.unpack_limits)
                result = _READY
            except ArtifactError as exc:
                result = Preparation("failed", str(exc), exc.reason, exc.retryable)
            except Exception as exc:
                log.warning("unpacking an artifact into %s failed", run_dir, exc_info=True)
                result = Preparation("failed", f"cannot unpack the artifact: {exc}", "StartFailed")
            self._done(prep, result)

    def _done(self, prep: _Prep, result: Preparation) -> None:
        with self._lock:
            current = self._runs.get(prep.run_dir) is prep
            if current:
                prep.result = result
            closed = self._closed
        if not current:  # discarded meanwhile: nobody will start it
            _clear(prep.run_dir)
        elif not closed:
            self._wake(prep.job)


def _clear(run_dir: Path) -> None:
    """Remove a run's unpacked folder and any unpacking a crash interrupted."""
    try:
        with os.scandir(run_dir) as found:
            names = [e.name for e in found if e.name == WORK or e.name.startswith(TEMP_PREFIX)]
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        try:
            remove_tree(run_dir / name)
        except OSError:
            log.warning("cannot remove %s", run_dir / name, exc_info=True)
