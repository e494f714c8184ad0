"""Wiring: one store, the local agent, the job reconciler, the work queue and its workers,
the change watcher (other processes' writes), the node heartbeat, the notifier lanes and the
source lanes."""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import TYPE_CHECKING

from .. import telemetry
from ..agent.local import LocalAgent
from ..clock import Clock, RealClock
from ..store import Store, queuing
from ..store import scheduling as sched
from ..store.feed import ChangeFeed, poll_interval
from ..store.transactions import Fenced
from ..threads import critical, fatal
from . import faults
from .handoff import Handoff
from .job import JobReconciler
from .nodes import DEFAULT_ADDRESS, heartbeat, heartbeat_interval, local_node_name, note_not_ready
from .notify import Deliverer
from .owners import controller_owner
from .runtime import Result, Runner, WorkQueue
from .settled import SettledHints

if TYPE_CHECKING:
    from .ingest import Ingester

log = logging.getLogger("reconciler.controller")

WAKE_ON_ROOM = 8  # jobs first in line woken when a pool or node may have room (each admission wakes on)
HEARTBEAT_RETRY = 0.5  # seconds after a failed heartbeat before the next try
DRAIN = 2.0  # on stop, how long events due now may take to be delivered (`up` ends right after its jobs)
# The cyclic collector's youngest generation is collected every this many allocations (the
# interpreter's default is 700). The loop and a Source's lane allocate models and rows that
# live for a step or a batch, and a young collection walks every young object still alive:
# at 700, and their promotions feeding full collections that walk every object of the
# process, they were a quarter of storing a batch of ingested jobs. At 5,000 the collector
# still took 0.6 s of a 40,000-message ingestion (309 young, 28 middle, 3 full collections,
# timed by gc.callbacks); at 50,000 with the process's startup objects frozen, 0.2 s.
GC_YOUNG = 50_000
_frozen = False  # the startup objects are frozen once a process (a leader may start a controller again)


def tune_collector() -> None:
    """Collect the young generation less often, and move what the process holds at its first
    controller's start (modules, classes, pydantic's schemas: it lives as long as the
    process) out of the collector's sight, so full collections walk only what came after."""
    global _frozen
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG), middle, old)
    if not _frozen:
        gc.freeze()
        _frozen = True


class Controller:
    def __init__(
        self,
        store: Store,
        *,
        node: str | None = None,
        workers: int = 1,
        clock: Clock | None = None,
        address: str | None = None,
        local_node: bool = True,
        sources: bool = True,
        term: int | None = None,
    ):
        """`local_node=False` (`serve --no-local-node`): this machine is no node. No Node is
        registered or kept Ready for it, and the agent here owns no node (its name is empty,
        which no Node can have), so it starts no run: jobs wait for other nodes. `sources=False`
        (`up`, `run --wait`): no Source is consumed. `term`: the controller lease's term this
        controller leads in (`serve`, leader.py); what it claims is owned in that term, so the
        leader of a later term takes it over."""
        self.store = store
        self.address = address or DEFAULT_ADDRESS  # where this node's services are reached: the registry publishes it
        self.clock = clock or RealClock()
        self.local_node = local_node
        self.node = (node or local_node_name()) if local_node else ""
        self.owner = controller_owner(term)
        self.queue = WorkQueue()
        self.notifier = Deliverer(store, clock=self.clock, owner=self.owner)
        self.sources: Ingester | None = None
        # jobs a Source's lane stored at rest: the change watcher does not queue them
        self.settled = SettledHints()
        if sources:  # not imported by `up`, which consumes no Source
            from .ingest import Ingester

            self.sources = Ingester(store, settled=self.settled.add)
        self.agent = LocalAgent(self.node, store.state_dir, on_exit=lambda job: self.queue.add(job, urgent=True))
        self._state = str(self.agent.state_dir)  # recorded on its node: servers beside it must share it
        self._workers = workers
        self.jobs = JobReconciler(
            store,
            self.agent,
            clock=self.clock,
            owner=self.owner,
            wake=self._wake_step,
            notified=lambda: store.after_commit(self.notifier.wake),
        )
        # writes the server's routes hand to the worker (an agent's reports): made in its batch
        self.handoff = Handoff(store, wake=lambda jobs: self.queue.add_many(jobs, urgent=True), workers=workers)
        self.runner = Runner(
            self.queue,
            self._step,
            workers=workers,
            batching=store,
            forget=self.jobs.forget,
            order=self.jobs.by_priority,
        )
        self._stop = threading.Event()
        self._watcher = critical("change-watcher", self._watch)
        self._feed: ChangeFeed | None = None
        self._interval = poll_interval()  # a bad RECONCILER_POLL_INTERVAL is refused here, not in the thread
        self.started_at = 0.0  # set by start()

    def start(self) -> Controller:
        tune_collector()
        # nodes' silence is counted from now at the earliest: no heartbeat could be heard by
        # this controller before, and one missed while none was up proves nothing of a node
        self.started_at = self.clock.now()
        self.jobs.runs.remote.since = self.started_at
        if self.local_node:
            heartbeat(self.store, self.node, self.owner, self.clock.now(), address=self.address, state_dir=self._state)
        self._feed = ChangeFeed(self.store, skip_known=True, listen=True, reports=True)
        with self.store.read() as session:
            for job, deps in sched.dependency_graph(session).items():
                for dep in deps:
                    self.jobs.dependents[dep].add(job)
            names = sched.open_job_names(session) + sched.job_names_needing_revision(session)
        self.queue.add_many(names)
        self.runner.start()
        self._watcher.start()
        self.notifier.start()
        if self.sources is not None:
            self.sources.start()
        telemetry.workqueue_depth = self.queue.__len__
        return self

    def stop(self, *, drain: bool = True) -> None:
        """`drain`: give events due now a moment to be delivered (not when stepping down:
        another server leads, and its lanes deliver them)."""
        self._stop.set()
        self.store.wakeups().poke()  # the change watcher may be waiting for a notification
        if telemetry.workqueue_depth == self.queue.__len__:
            telemetry.workqueue_depth = None
        if self.sources is not None:
            self.sources.stop()  # first: no job arrives while the rest stops
        self.jobs.runs.spawns.close()  # first: no run starts while the rest stops (the spawn in progress ends)
        self.handoff.close()  # writes handed and not taken go back to their callers (the routes write them)
        self.runner.stop()
        if drain:
            self.notifier.drain(DRAIN)
        self.notifier.stop()
        self.jobs.paths.close()
        self.jobs.probes.close()
        self._watcher.join(2)
        self.agent.close()

    def _step(self, job: str) -> Result:
        """A job's step, after the writes handed to the worker (`Handoff`): a step a hand
        woke reads what was handed for it."""
        self.handoff.take()
        return self.jobs(job)

    def _wake_step(self, job: str, urgent: bool = False) -> None:
        """A step's wake-up of a job: the woken job's step must read what this step wrote.
        With one worker, the only thread that takes keys is this one, and it reads through
        its batch's transaction: the job is queued at once, and the same batch may take it
        (a chain's next job is admitted in the transaction that completes the one before,
        one commit a link fewer). With more workers, another one could read the state before
        this batch commits: the wake-up waits for the commit."""
        if self._workers == 1:
            self.queue.add(job, urgent)
        else:
            self.store.after_commit(lambda: self.queue.add(job, urgent))

    def wake(self, job: str) -> None:
        """Something about the job's run happened elsewhere (a remote agent's report): look
        at it now, in the urgent lane."""
        self.queue.add(job, urgent=True)

    def _wake_first_in_line(self) -> None:
        with self.store.read() as session:
            for name in queuing.first_in_line(session, None, WAKE_ON_ROOM):
                self.queue.add(name, urgent=True)

    def _watch(self) -> None:
        """Notice other processes' writes through the change feed, and post the node's
        heartbeat, here rather than through the work queue, where a backlog of thousands of
        jobs could hold it past the node's readiness window."""
        # start() opens the feed before it lists the open jobs, so no change falls in between
        feed = (
            self._feed if self._feed is not None else ChangeFeed(self.store, skip_known=True, listen=True, reports=True)
        )
        interval = self._interval
        next_beat = time.monotonic() + heartbeat_interval()
        next_poll = time.monotonic() + interval
        while True:
            # woken by another process's write (PostgreSQL's notifications), the poll's period
            # or the heartbeat's; the feed is read on the first two only
            until = min(next_poll, next_beat)
            announced = feed.wait(max(0.0, until - time.monotonic()))
            if self._stop.is_set():
                return
            faults.point("watcher-dies")
            if self.store.file_replaced():
                fatal(
                    f"the store file {self.store.path} was deleted or replaced under this controller; stopping, "
                    "for its writes would go to a file no other process reads (start it again on the new store)"
                )
            if time.monotonic() >= next_beat:
                try:
                    swept_at = self.jobs.paths.swept_at
                    if self.local_node and heartbeat(
                        self.store,
                        self.node,
                        self.owner,
                        self.clock.now(),
                        paths_swept_at=swept_at,
                        address=self.address,
                        state_dir=self._state,
                    ):
                        # Ready again (or registered again): a write of this process, which the
                        # change feed skips, so the jobs that found no node are woken here
                        self._wake_first_in_line()
                    next_beat = time.monotonic() + heartbeat_interval()
                except Fenced:  # another server leads: this controller is being stopped
                    next_beat = time.monotonic() + heartbeat_interval()
                except Exception:  # the store may be briefly unavailable: try again shortly
                    log.warning("node heartbeat failed", exc_info=True)
                    next_beat = time.monotonic() + HEARTBEAT_RETRY
                try:  # after its own heartbeat: a watcher that stalled says nothing wrong of its own node
                    note_not_ready(self.store, self.clock.now(), self.started_at)  # any node whose heartbeats stopped
                except Exception:  # the store may be briefly unavailable: said at the next beat
                    log.warning("checking the nodes' heartbeats failed", exc_info=True)
            if not announced and time.monotonic() < next_poll:
                continue  # a heartbeat's turn only
            next_poll = time.monotonic() + interval
            try:
                foreign = feed.poll()
                # added at once: jobs stored together are ordered together (by priority)
                self.queue.add_many([c.name for c in foreign if c.kind == "Job" and not self.settled.take(c)])
                self.settled.prune(feed.seq)
                if any(change.kind in ("Pool", "Node") for change in foreign):
                    self._wake_first_in_line()  # a pool or node may have room now
            except Exception:  # the database may be briefly unavailable; try on the next tick
                log.warning("change watcher failed", exc_info=True)
                self._stop.wait(0.5)
