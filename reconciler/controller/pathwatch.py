"""Path waits polled off the work queue: one thread sweeps the waiting jobs' paths, one
sweep per poll interval (jittered 90-110%), and wakes a job only when one of its paths
appears. Thousands of jobs waiting on files then cost a few thousand stat calls a second
in one loop, not a reconcile each."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from ..clock import Clock
from ..threads import critical
from .waits import check_path

PathCondition = tuple[str, "str | None", float]  # path, type, interval


class PathWatch:
    def __init__(self, wake: Callable[[str], None], clock: Clock):
        self._wake = wake
        self._clock = clock
        self._rand = random.Random()
        self._cond = threading.Condition()
        self._groups: dict[float, dict[str, list[tuple[str, str | None]]]] = {}  # interval -> job -> paths
        self._next: dict[float, float] = {}  # interval -> when its next sweep is due (monotonic)
        self._stop = False
        self.swept_at: float | None = None  # when the last sweep checked every path (wall clock)
        self._thread = critical("path-watch", self._run)
        self._thread.start()

    def watch(self, job: str, conditions: list[PathCondition]) -> None:
        """Check these paths for `job` from now on; replaces what was watched for it."""
        interval = min(c[2] for c in conditions)
        with self._cond:
            self._remove(job)
            self._groups.setdefault(interval, {})[job] = [(path, kind) for path, kind, _ in conditions]
            if interval not in self._next:
                self._next[interval] = self._clock.monotonic() + interval * self._jitter()
                self._cond.notify()

    def forget(self, job: str) -> None:
        with self._cond:
            self._remove(job)

    def _remove(self, job: str) -> None:
        for jobs in self._groups.values():
            jobs.pop(job, None)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(2)

    def __len__(self) -> int:
        with self._cond:
            return sum(len(jobs) for jobs in self._groups.values())

    def _jitter(self) -> float:
        return 0.9 + 0.2 * self._rand.random()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop:
                    now = self._clock.monotonic()
                    due = min(self._next.items(), key=lambda item: item[1], default=None)
                    if due is not None and due[1] <= now:
                        break
                    self._cond.wait(None if due is None else due[1] - now)
                if self._stop or due is None:
                    return
                interval = due[0]
                jobs = list(self._groups.get(interval, {}).items())
                if jobs:
                    self._next[interval] = now + interval * self._jitter()
                else:
                    self._next.pop(interval)
                    self._groups.pop(interval, None)
            appeared = [job for job, paths in jobs if any(check_path(path, kind)[0] for path, kind in paths)]
            if jobs:
                self.swept_at = self._clock.now()
            for job in appeared:
                self.forget(job)
                self._wake(job)
