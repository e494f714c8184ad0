"""Wiring: one store, the local agent, the job reconciler, the work queue and its workers,
the change watcher (other processes' writes) and the node heartbeat."""

from __future__ import annotations

import logging
import threading
import time

from ..clock import RealClock
from ..store import Store
from ..store import repository as repo
from ..store import scheduling as sched
from .job import JobReconciler
from .nodes import HEARTBEAT_INTERVAL, heartbeat, local_node_name
from .runs import controller_identity
from .runtime import Runner, WorkQueue

log = logging.getLogger("reconciler.controller")

WATCH_INTERVAL = 0.05  # how far behind other processes' writes we may be


class Controller:
    def __init__(
        self, store: Store, *, node: str | None = None, workers: int = 1, clock=None, strategy: str = "spread"
    ):
        from ..agent.local import LocalAgent

        self.store = store
        self.clock = clock or RealClock()
        self.node = node or local_node_name()
        self.owner = controller_identity()
        self.queue = WorkQueue()
        self.agent = LocalAgent(
            self.node, store.state_dir, on_exit=lambda job: self.queue.add(("Job", job), urgent=True)
        )
        self.jobs = JobReconciler(
            store,
            self.agent,
            clock=self.clock,
            owner=self.owner,
            strategy=strategy,
            wake=lambda job, urgent=False: self.queue.add(("Job", job), urgent),
        )
        self.runner = Runner(self.queue, lambda key: self.jobs, workers=workers)  # every key is a job's
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="change-watcher", daemon=True)
        self._seen = 0

    def start(self) -> Controller:
        heartbeat(self.store, self.node, self.owner, self.clock.now())
        self._seen = self.store.change_seq()
        with self.store.read() as session:
            for job, deps in sched.dependency_graph(session).items():
                for dep in deps:
                    self.jobs.dependents[dep].add(job)
            names = sched.open_job_names(session) + sched.job_names_needing_revision(session)
        for name in names:
            self.queue.add(("Job", name))
        self.runner.start()
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.runner.stop()
        self.jobs.paths.close()
        self.jobs.probes.close()
        self._watcher.join(2)
        self.agent.close()

    def _watch(self) -> None:
        """Notice other processes' writes through the change sequence: the cost of a look is
        one tiny query, and of a change the rows that changed. Also post the node's
        heartbeat, here rather than through the work queue, where a backlog of thousands of
        jobs could hold it past the node's readiness window."""
        next_beat = time.monotonic() + HEARTBEAT_INTERVAL
        while not self._stop.wait(WATCH_INTERVAL):
            if time.monotonic() >= next_beat:
                try:
                    heartbeat(self.store, self.node, self.owner, self.clock.now())
                    next_beat = time.monotonic() + HEARTBEAT_INTERVAL
                except Exception:  # the store may be briefly unavailable: the next tick tries again
                    log.warning("node heartbeat failed", exc_info=True)
            try:
                seq = self.store.change_seq()
                if seq == self._seen:
                    continue
                with self.store.read() as session:
                    rows = sched.changed_since(session, self._seen)
                own = self.store.own_writes
                foreign = [(kind, name) for kind, name, rv in rows if rv not in own]
                self.store.own_writes = {rv for rv in own if rv > seq}
                self._seen = seq
                for kind, name in foreign:
                    if kind == "Job":
                        self.queue.add(("Job", name))
                if any(kind in ("Pool", "Node") for kind, _ in foreign):
                    with self.store.read() as session:
                        for name in sched.first_in_line(session, None, 8):
                            self.queue.add(("Job", name), urgent=True)  # a pool or node may have room now
            except Exception:  # the database may be briefly unavailable; try on the next tick
                log.warning("change watcher failed", exc_info=True)
                self._stop.wait(0.5)


def job_phases(store: Store, names: list[str]) -> dict[str, dict]:
    """name -> status of the named jobs (benchmarks and tests read them this way)."""
    with store.read() as session:
        return {o.name: (o.status or {}) for o in repo.list_objects(session, kind="Job", names=names)}
