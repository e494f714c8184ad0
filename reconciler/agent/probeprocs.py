"""The probe processes a controller runs, one small file each, so that the next controller
kills those a crash left behind. A probe leads its own session, which only its starter kills
(at its timeout, or when it closes); a controller killed with kill -9 kills nothing, and its
probes would run on unbounded, beside the new controller's own probe of the same condition.

A file `PROBE_PID` holds the probe's start time and its owner's pid and start time. At start
(`reap_orphans`) a controller kills the session of each probe whose owner is gone and that is
still the process recorded (start times: a reused pid is a stranger), and removes the file.
A probe of a live owner (another controller on this host) is left alone."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

from ..files import make_private_dirs, read_small
from .identity import ProcessIdentity, is_alive, start_time_of

log = logging.getLogger(__name__)


class ProbeProcs:
    def __init__(self, folder: Path):
        self.folder = folder
        make_private_dirs(folder)
        self._me = ProcessIdentity(os.getpid(), start_time_of(os.getpid()) or 0.0)

    def started(self, pid: int) -> None:
        started = start_time_of(pid)
        if started is None:  # gone already: nothing to leave behind
            return
        text = f"{started} {self._me.pid} {self._me.start_time}\n"
        part = self.folder / f"{pid}.part"  # renamed into place whole: no reader sees half a record
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.rename(part, self.folder / str(pid))

    def ended(self, pid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.folder / str(pid))

    def reap_orphans(self) -> int:
        """Kill the probes whose controller is gone; how many were still running."""
        killed = 0
        for path in self.folder.iterdir():
            if not path.name.isdecimal():
                continue  # a record being written (PID.part), or not ours
            parts = (read_small(path) or "").split()
            if len(parts) != 3:
                path.unlink(missing_ok=True)  # not a record: nothing to trust
                continue
            probe = ProcessIdentity(int(path.name), float(parts[0]))
            owner = ProcessIdentity(int(parts[1]), float(parts[2]))
            if is_alive(owner):
                continue  # a live controller's probe (this process's too: its own close kills them)
            if is_alive(probe):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(probe.pid, signal.SIGKILL)  # its own session: it and what it started
                    killed += 1
                log.info("killed probe %d left by a controller that is gone", probe.pid)
            path.unlink(missing_ok=True)
        return killed
