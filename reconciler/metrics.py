"""Prometheus metrics (`controller --metrics-port`, and `GET /metrics` of `serve`): gauges
computed at scrape time from indexed queries of the store, with the counters and
histograms the controller keeps as it goes (telemetry.py). Names follow what Kueue and
Argo users chart."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import telemetry
from .api.node import heartbeat_fresh
from .store import repository as repo
from .store import scheduling as sched
from .store import stats

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from .store import Store

GLOBAL = "global"  # the pool label of a job that names no pool: only the global limit charges it


def pending_reason(phase: str, reason: str | None) -> str:
    """Why a job that has not started waits, in the words of reconciler_pending_jobs."""
    if phase == "Queued":
        return "Unschedulable" if reason == "Unschedulable" else "Queued"
    return phase  # Waiting or Backoff


class StoreCollector:
    """A prometheus_client collector: every scrape reads the store once (one read
    transaction) and the process's counters."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self.store.read() as session:
            by_state = stats.jobs_by_state(session)
            pending = stats.pending_jobs(session)
            used, _queued, _nodes = sched.usage(session)
            pools = repo.list_objects(session, kind="Pool")
            nodes = repo.list_objects(session, kind="Node")

        jobs = GaugeMetricFamily("reconciler_jobs", "Jobs by phase and outcome.", labels=["phase", "outcome"])
        for phase, outcome, n in by_state:
            jobs.add_metric([phase or "Waiting", outcome or ""], n)
        yield jobs

        waiting = GaugeMetricFamily(
            "reconciler_pending_jobs",
            "Jobs not yet running, by their pool (global: none named) and why they wait.",
            labels=["pool", "reason"],
        )
        counts: dict[tuple[str, str], int] = {}
        for phase, pool, reason, n in pending:
            key = (pool or GLOBAL, pending_reason(phase, reason))
            counts[key] = counts.get(key, 0) + n
        for (pool, reason), n in sorted(counts.items()):
            waiting.add_metric([pool, reason], n)
        yield waiting

        slots = GaugeMetricFamily(
            "reconciler_pool_slots",
            "Slots of each pool: used, and capacity (+Inf: unlimited).",
            labels=["pool", "state"],
        )
        capacity = {p.name: p.spec.get("slots") for p in pools}
        for name in sorted({*capacity, GLOBAL}):
            in_use = sum(used.values()) if name == GLOBAL else used.get(name, 0)
            limit = capacity.get(name, "unlimited")
            slots.add_metric([name, "used"], int(in_use or 0))
            slots.add_metric([name, "capacity"], math.inf if limit in (None, "unlimited") else float(limit))
        yield slots

        ready = GaugeMetricFamily("reconciler_node_ready", "1 while the node's heartbeat is fresh.", labels=["node"])
        now = time.time()
        for node in nodes:
            ready.add_metric([node.name], 1.0 if heartbeat_fresh(node.status, now) else 0.0)
        yield ready

        if telemetry.workqueue_depth is not None:
            yield GaugeMetricFamily(
                "reconciler_workqueue_depth", "Jobs waiting for a reconcile worker.", value=telemetry.workqueue_depth()
            )
        for counter in (telemetry.RUNS, telemetry.RUNS_LOST, telemetry.NOTIFICATIONS):
            family = CounterMetricFamily(counter.name.removesuffix("_total"), counter.help, labels=list(counter.labels))
            for values, total in counter.samples():
                family.add_metric(list(values), total)
            yield family
        for histogram in (telemetry.RUN_DURATION, telemetry.ADMISSION_WAIT, telemetry.RECONCILE):
            buckets, total, _count = histogram.snapshot()
            spread = HistogramMetricFamily(histogram.name, histogram.help)
            spread.add_metric([], [(_bound(b), n) for b, n in buckets], total)
            yield spread


def _bound(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def registry_for(store: Store) -> CollectorRegistry:
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return registry


def exposition(store: Store) -> tuple[bytes, str]:
    """One scrape in the text format: (body, content type)."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry_for(store)), CONTENT_TYPE_LATEST


def serve_metrics(store: Store, host: str, port: int) -> Any:
    """An HTTP server answering /metrics on host:port in a thread of its own; returns it
    (shutdown() stops it)."""
    from prometheus_client.exposition import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=registry_for(store))
    return server
