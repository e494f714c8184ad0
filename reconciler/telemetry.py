"""What the controller counts as it goes: runs ended, their durations, waits for
admission, reconciles, notifier deliveries. Plain counters and histogram buckets in this
process; `metrics.py` exposes them in the Prometheus format (prometheus_client) at scrape
time. Importing prometheus_client here instead would cost every `up` 50-140 ms for a feature
it does not use; what is kept here is only the arithmetic."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

# seconds; Prometheus' default buckets stop at 10 s, runs and waits go longer
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 900.0, 3600.0)
STEP_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class Counter:
    def __init__(self, name: str, help: str, labels: tuple[str, ...]):
        self.name, self.help, self.labels = name, help, labels
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, *values: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[values] = self._values.get(values, 0.0) + amount

    def samples(self) -> list[tuple[tuple[str, ...], float]]:
        with self._lock:
            return sorted(self._values.items())


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help, buckets
        self._lock = threading.Lock()
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[tuple[float, int]], float, int]:
        """(cumulative count per upper bound, +Inf last; sum; count)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
            running += n
            cumulative.append((bound, running))
        return cumulative, total, running


RUNS = Counter("reconciler_runs_total", "Runs that ended, by outcome and reason.", ("outcome", "reason"))
RUNS_LOST = Counter("reconciler_runs_lost_total", "Runs recorded Lost, by reason.", ("reason",))
RUN_DURATION = Histogram("reconciler_run_duration_seconds", "How long ended runs ran.", RUN_BUCKETS)
ADMISSION_WAIT = Histogram(
    "reconciler_admission_wait_seconds", "From eligible (queued) to admitted, per admission.", WAIT_BUCKETS
)
RECONCILE = Histogram(
    "reconciler_reconcile_duration_seconds", "One reconcile of a job, every step it took.", STEP_BUCKETS
)
NOTIFICATIONS = Counter(
    "reconciler_notifications_total",
    "Notifier delivery attempts, by notifier and result (delivered, retry, failed).",
    ("notifier", "result"),
)

# the controller's work queue depth, read at scrape time (set by the controller that runs)
workqueue_depth: Callable[[], int] | None = None
