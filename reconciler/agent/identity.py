"""Recognising a process again: (pid, start time), never the pid alone.

Pids are reused (pid_max is often 32768), and an agent that adopts runs after
a restart must not mistake a stranger for its run.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

# psutil derives create_time from clock ticks (1/100 s) plus the boot time, so
# two readings of the same process agree exactly; the tolerance only absorbs
# float rounding. See is_alive for the one way this can still go wrong.
START_TIME_TOLERANCE = 0.01


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_reading = threading.Lock()  # one reader of a child's start time at a time: see `of_child`


class ProcessIdentity:
    """A process: its pid and its start time (psutil.Process.create_time(), seconds since
    the epoch). Equal when both are; never changed once made."""

    __slots__ = ("_start_time", "pid")

    def __init__(self, pid: int, start_time: float):
        self.pid = pid
        self._start_time: float | None = start_time

    @classmethod
    def of_child(cls, pid: int) -> ProcessIdentity:
        """A child just spawned, its start time read at its first use rather than now: read
        while the child is still in its exec, /proc/PID/stat answers only once the exec is
        done (0.5-1 ms measured on the loop's path), which would sit on the spawner's path.
        Read later, the answer is the same, provided the pid still names the child: it does
        until the child is reaped, and `process.reap` reads it first."""
        child = cls.__new__(cls)
        child.pid, child._start_time = pid, None
        return child

    @property
    def start_time(self) -> float:
        return self._start_time if self._start_time is not None else self.read_start_time()

    def read_start_time(self) -> float:
        """The start time, read now if it was not: a child's before it is reaped."""
        with _reading:
            if self._start_time is None:
                found = start_time_of(self.pid)  # a zombie still answers
                # gone only if someone else reaped it: any value will do, is_alive is False
                self._start_time = time.time() if found is None else found
            return self._start_time

    @property
    def start_known(self) -> bool:
        """The start time has been read (always, but for a child not yet looked at)."""
        return self._start_time is not None

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ProcessIdentity):
            return NotImplemented
        return self.pid == other.pid and self.start_time == other.start_time

    def __hash__(self) -> int:
        return hash(self.pid)  # equal identities share their pid; no read of a start time

    def __repr__(self) -> str:
        start = "unread" if self._start_time is None else repr(self._start_time)
        return f"ProcessIdentity(pid={self.pid}, start_time={start})"


def _stat(pid: int) -> tuple[bytes, float] | None:
    """A process's state letter and its start time, exactly as psutil's create_time computes
    it (the start in clock ticks since boot, over the ticks a second, plus the boot time that
    /proc/stat gives now), from one read of /proc/PID/stat; None when there is no such
    process. A spawn and every liveness check ask this: psutil's object for a new pid cost
    about 80 us on the reconcile loop's path, this read about 10."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:  # gone (ENOENT, ESRCH), or hidden from us as psutil's AccessDenied is
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0], float(fields[19]) / _CLOCK_TICKS + psutil.boot_time()


def start_time_of(pid: int) -> float | None:
    """psutil.Process(pid).create_time(), or None when there is no such process (a zombie
    still answers)."""
    found = _stat(pid)
    return None if found is None else found[1]


def same_process(identity: ProcessIdentity) -> bool:
    """Whether `identity` still names a process (zombies included): its start time read
    from /proc as psutil's create_time computes it, without building a psutil object (the
    exit watcher asks it of every run it reaps)."""
    start = start_time_of(identity.pid)
    return start is not None and abs(start - identity.start_time) <= START_TIME_TOLERANCE


def is_alive(identity: ProcessIdentity) -> bool:
    """True when the process exists, is not a zombie and has the same start time.

    Caveat: psutil's create_time is wall-clock based (boot time from
    /proc/stat is derived from the current clock), so a clock step (NTP)
    between spawn and check shifts it and a live run then looks dead.
    """
    found = _stat(identity.pid)
    if found is None:
        return False
    state, start_time = found
    return abs(start_time - identity.start_time) <= START_TIME_TOLERANCE and state not in (b"Z", b"X")


def wall_clock_start(identity: ProcessIdentity) -> float:
    """When the process started, on the wall clock to within ~10 ms, even once it is gone.

    Not for identity (use start_time): psutil's create_time adds the boot time that
    /proc/stat gives in whole seconds, so as a timestamp it may be up to a second early (a
    quick run would seem to start before the jobs it waited for). The seconds since boot
    are what create_time adds that boot time to; the precise boot time is now less the
    uptime, which /proc/uptime gives to 10 ms."""
    since_boot = identity.start_time - psutil.boot_time()
    try:
        with open("/proc/uptime", "rb") as up:
            uptime = float(up.read().split()[0])
    except (OSError, ValueError, IndexError):
        return identity.start_time
    return time.time() - uptime + since_boot
