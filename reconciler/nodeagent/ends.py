"""A run's end: the exit watcher's call (or a stop's tick) when a wrapper is gone, and what
is recorded then (its exit, or none: gone), with what its cgroup counted, before its
leftovers and folders are cleared. A call for a job whose artifact became ready starts it."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ..api.meta import from_epoch
from .records import Record
from .shared import Shared

log = logging.getLogger("reconciler.agent")


class Ends(Shared):
    def _exited(self, job: str) -> None:
        with self._lock:
            record = self._records.get(job)
            preparing = self._preparing.get(job)
        if preparing is not None and (
            record is None or record.uid != preparing["uid"] or record.run != preparing["run"]
        ):
            self._start(preparing)  # its artifact is ready, or cannot be
            return
        if record is None or record.finished:
            return
        if record.identity is not None and self.local.wrapper_alive(record.identity):
            return  # the call was for an older run of the job; this one lives
        if not record.finished:
            self._record_end(record)
            self._pending.set()
            if record.settled:  # a stale run's end: the admission waiting for it is taken now
                self._relook.set()

    def _record_end(self, record: Record) -> None:
        """The wrapper is gone: its exit record, or none (the run is gone without one)."""
        run_dir = Path(record.dir)
        exited = self.local.exit_of(run_dir)
        identity = record.identity
        if identity is not None and _group_exists(identity.pid) and self.local.leftovers(identity, record.cgroup):
            self.local.kill(identity, record.cgroup, wrapper_too=True)  # the command ended and left processes behind
        if exited is None:
            record.gone = True
            record.finished_at = from_epoch(time.time())
        else:
            record.exit_code, record.signal = exited.exit_code, exited.signal
            try:
                record.finished_at = from_epoch((run_dir / "exit").stat().st_mtime)
            except OSError:
                record.finished_at = from_epoch(time.time())
        if record.cgroup is not None:
            usage = self.local.usage(record.cgroup)
            if usage is not None:
                record.peak_memory, record.cpu_seconds = usage.peak_memory, usage.cpu_seconds
                record.oom_kills = usage.oom_kills
            if not self.local.remove_cgroup(record.cgroup):  # cannot be: its processes are gone
                log.warning(
                    "the cgroup %s of run %d of job %s could not be removed", record.cgroup, record.run, record.job
                )
        self.local.stop_trimming(run_dir)
        if (run_dir / "work").exists():
            self.local.discard_work(run_dir)  # an artifact's unpacked folder goes with the run
        record.save()

    def _finished(self, folder: str) -> bool:
        with self._lock:
            record = self._by_folder.get(folder)
        return record is None or record.finished


def _group_exists(pgid: int) -> bool:
    """Any process left in the group (one syscall; the scan of the process table that tells
    the wrapper's own from strangers' is taken only when there is)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
