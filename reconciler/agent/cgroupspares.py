"""Spare cgroups: empty ones a thread of the agent makes ahead, so that starting a run
renames one instead of making it (`Spares`, taken by `local.py`). Spares left by a process
that died are swept when the next one starts. Only where cgroups can be renamed (v1:
`Hierarchy.renames`); cgroup2's filesystem refuses a rename, so there each run's is made."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid

import psutil

from .cgroups import NO_LIMITS, CgroupExists, CgroupUnavailable, Hierarchy, Limits, RunCgroup

log = logging.getLogger(__name__)

REFILL_DELAY = 0.005
SPARE = "spare-"  # spare-<pid of the agent's process>-<random>: found and swept once that process is gone


def sweep(hierarchy: Hierarchy) -> None:
    """Remove the spares of processes that are gone (a controller killed): also where no
    spares are made now (v2), for those an earlier version made there."""
    for parent in hierarchy.parents():
        try:
            entries = [e for e in os.listdir(parent) if e.startswith(SPARE)]
        except OSError:
            continue
        for entry in entries:
            pid = entry[len(SPARE) :].partition("-")[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                with contextlib.suppress(OSError):
                    (parent / entry).rmdir()


class Spares:
    """Empty cgroups made ahead by a thread of its own, so that starting a run renames one
    (about 0.03 ms a hierarchy) instead of making it (a mkdir in a v1 memory hierarchy alone
    costs 0.1-0.3 ms, on the reconcile loop's path). A spare is made with the limits of the
    last run that took one, so that a run with the same limits (most are: a job's defaults, or
    a graph of like jobs) writes none of them at its start either (four writes, about 0.35 ms);
    a run with others writes those that differ. `take` never waits for the thread: with no
    spare ready it makes the run's cgroup itself. Spares left by a process that died are
    removed when the next one starts, and a process's own when it closes."""

    def __init__(self, hierarchy: Hierarchy, keep: int = 4):
        if not hierarchy.renames:
            raise ValueError(f"cgroup {hierarchy.version} cannot rename a cgroup: no spare could become a run's")
        self.hierarchy = hierarchy
        self.keep = keep
        self._ready: list[RunCgroup] = []
        self._limits = NO_LIMITS  # the last run's: the next spares are made with them
        self._refused: Limits | None = None  # limits a spare could not be made with: not tried again until others come
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()  # ends the refill's pause: close() waits for no fixed sleep
        self._closed = False
        self._thread: threading.Thread | None = None
        self._prefix = f"{SPARE}{os.getpid()}-"

    def take(self, name: str, limits: Limits) -> RunCgroup:
        """Run `name`'s cgroup with `limits` (CgroupUnavailable when none can be made)."""
        with self._lock:
            spare = self._ready.pop() if self._ready else None
        try:
            group = None
            if spare is not None:
                try:
                    group = self.hierarchy.rename(spare, name, limits)
                except CgroupExists:  # made before a crash: create() gives it the run's limits
                    pass
                except CgroupUnavailable as exc:
                    log.warning("%s; making the cgroup instead", exc)
                if group is None:
                    spare.remove()
            if group is None:
                group = self.hierarchy.create(name, limits)
            with self._lock:
                if limits != self._limits:
                    self._refused = None  # others now: those refused may be tried again when they come back
                self._limits = limits  # written: the next spares are made with them
            return group
        finally:
            # the next spare is made after this one was taken: made at once, the two would
            # queue on the kernel's cgroup lock and the take would wait for the mkdir; and the
            # thread starts after the first take, so that its first spares have its limits
            with self._lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._fill, name="cgroup-spares", daemon=True)
                    self._thread.start()
            self._wake.set()

    def ready(self) -> int:
        with self._lock:
            return len(self._ready)

    def _fill(self) -> None:
        try:
            self.sweep()
            while not self._closed:
                while not self._closed and self.ready() < self.keep:
                    spare = self._make()
                    with self._lock:
                        self._ready.append(spare)
                self._wake.wait()
                self._wake.clear()
                # after the spawn that took a spare: making one at once would contend with it
                # (for the interpreter's lock, and in the kernel for the cgroup lock its join takes)
                self._closing.wait(REFILL_DELAY)
        except CgroupUnavailable as exc:  # runs get none either: the agent says so per cause
            log.info("no spare cgroups are made ahead: %s", exc)
        except Exception:  # a spare is a saving, not a need: take makes cgroups itself from now on
            log.warning("no more spare cgroups are made ahead", exc_info=True)

    def _make(self) -> RunCgroup:
        """A spare with the last run's limits; without limits if those cannot be written (a
        parent's quota changed since): only a spare that cannot be made at all stops the
        thread."""
        with self._lock:
            limits = self._limits if self._limits != self._refused else NO_LIMITS
        name = f"{self._prefix}{uuid.uuid4().hex[:12]}"
        try:
            return self.hierarchy.create(name, limits)
        except CgroupUnavailable as exc:
            if limits == NO_LIMITS:
                raise
            log.info("spare cgroups with %s are made without them: %s", limits, exc)
            with self._lock:
                self._refused = limits
            return self.hierarchy.create(name, NO_LIMITS)

    def sweep(self) -> None:
        """Remove the spares of processes that are gone (a controller killed)."""
        sweep(self.hierarchy)

    def close(self) -> None:
        """Stop making spares and remove the ones left."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._closing.set()
        self._wake.set()
        if thread is not None:
            thread.join(timeout=5)
        with self._lock:
            left, self._ready = self._ready, []
        for spare in left:
            spare.remove()
