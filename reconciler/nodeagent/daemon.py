"""`reconciler agent`: a node on another machine. It dials out to the server: posts its
Node's heartbeat, follows the runs placed on its node (a long poll answered as soon as they
change), starts each under the crash-safe wrapper the controller's own agent uses, and
reports start and end; it stops what the server asks to stop, and what the server no longer
counts (a report refused with 409). It keeps no store: what it must remember across a
restart is in each run's folder (records.py)."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..agent.forkserver import ForkServerUnsure
from ..agent.local import LocalAgent, StartFailed, process_owner
from ..agent.probe import Probes
from ..api.job import JobSpec, WaitCondition
from ..api.meta import from_epoch
from .api import Api, Stale, Unauthorized, Unreachable
from .logserver import LogServer
from .records import Record, load, load_all

log = logging.getLogger("reconciler.agent")

HEARTBEAT_INTERVAL = float(os.environ.get("RECONCILER_HEARTBEAT_INTERVAL", "10"))
LONG_POLL = 30.0  # seconds the server may hold a runs request
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0  # reconnecting to a server that does not answer
TICK = 0.1  # stops in progress (SIGKILL after the grace period) are looked at this often
WRAPPER_GRACE = 2.0  # after SIGKILL of the group, how long the wrapper gets to record
REPORT_BATCH = 200  # reports sent in one request at most
# A start is reported this long after it, unless the run ends before: a short run's start
# and end then go in one report, which the server writes in one step. An end goes at once.
START_REPORT_DELAY = float(os.environ.get("RECONCILER_START_REPORT_DELAY", "0.05"))
READY_WINDOW = 40.0  # the server's Ready window (README), when its heartbeat answer does not say it


@dataclass
class Options:
    server: str
    node: str
    state_dir: Path
    token: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    slots: int | None = None
    cpu: str | None = None
    memory: str | None = None
    log_port: int | None = None
    log_host: str = "0.0.0.0"
    address: str | None = None
    verify: bool | str = True


class NodeAgent:
    def __init__(self, options: Options):
        self.options = options
        self.owner = process_owner()
        self.api = Api(options.server, options.node, options.token, options.verify, agent=self.owner)
        self.local = LocalAgent(options.node, options.state_dir, on_exit=self._exited)
        self.address = options.address or _route_to(options.server)
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}  # job -> its run on this node still to settle
        self._by_folder: dict[str, Record] = {}
        self._preparing: dict[str, dict[str, Any]] = {}  # job -> its item, while its artifact is fetched
        # job -> (uid, probe, cwd, the job's env)
        self._readiness: dict[str, tuple[str, WaitCondition, str | None, dict[str, str]]] = {}
        self.probes = Probes(wake=lambda _job: None)  # looked at on each tick: nothing to wake
        self._specified: set[str] = set()  # run folders whose spec this process has acted on
        self._pending = threading.Event()  # reports to send
        self._batches = True  # the server takes several reports in one request (runs/reports)
        self._quiet_until: dict[str, float] = {}  # run folder -> when its start is reported, unless it ends first
        self._stop = threading.Event()
        # set once a heartbeat is accepted: until then this agent may be a duplicate of the one
        # serving its node, and it learns of no run, starts none and reports none
        self._accepted = threading.Event()
        # a lease: runs start only until the last accepted heartbeat, as sent, is older than the
        # server's Ready window; past it another host's agent may have taken the node over
        self._lease_until = 0.0  # time.monotonic()
        self._replaced = False  # another agent serves the node: this one starts nothing more
        self._fresh_after = 0.0  # time.monotonic(): runs start only from answers received after it
        self._received = 0.0  # when the long poll's last answer came
        self._says_withdraws = True  # off for a server of the version before (it refuses the field)
        self._reconciling = threading.Lock()  # one look at the placed runs at a time
        self._last_items: list[dict[str, Any]] | None = None  # the long poll's last answer
        self._skipped: set[str] = set()  # jobs whose admission waits for an older run's record to settle
        self._relook = threading.Event()  # a record settled: look at the last answer again
        self._threads: list[threading.Thread] = []
        self.logs: LogServer | None = None
        self.failed: str | None = None  # why the agent gave up (its node is another agent's, a bad token)
        self.exit_code = 1  # with `failed`: 1 the node is another agent's, 2 bad configuration (token)

    # -- life ------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        for record in load_all(self.options.state_dir / "runs"):
            self._adopt(record)
        if self.options.log_port is not None:
            self.logs = LogServer(
                self.options.log_host,
                self.options.log_port,
                self.options.state_dir / "runs",
                self.options.token,
                self._finished,
            ).start()
        for name, target in (
            ("heartbeat", self._beat),
            ("runs", self._follow),
            ("reports", self._report),
            ("stops", self._tick),
        ):
            thread = threading.Thread(target=self._guarded, args=(name, target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _guarded(self, name: str, loop: Callable[[], None]) -> None:
        """A loop of the agent that must not end: an unexpected error is logged, and the loop
        starts again a moment later (each loop keeps its state in the records, not the stack)."""
        while not self._stop.is_set():
            try:
                loop()
            except Exception:
                log.exception("the agent's %s loop failed; starting it again", name)
                self._pending.set()
                self._stop.wait(1.0)

    def stop(self) -> None:
        """The agent stops; its runs go on (a restarted agent adopts them)."""
        self._stop.set()
        self._pending.set()
        if self.logs is not None:
            self.logs.stop()
        for thread in self._threads:
            thread.join(2)
        self.probes.close()
        self.local.close()
        self.api.close()

    def wait(self) -> None:
        self._stop.wait()

    def _adopt(self, record: Record) -> None:
        """A run found in the state dir at start: watched if alive, its end read if not."""
        self._keep(record)
        identity = record.identity
        if record.finished:
            self._pending.set()
            return
        if identity is not None and self.local.wrapper_alive(identity):
            self.local.watch(record.job, identity)  # its end is recorded when the watcher calls
            log.info("adopted run %d of job %s (pid %d)", record.run, record.job, identity.pid)
        else:
            self._record_end(record)
        self._pending.set()

    def _keep(self, record: Record) -> None:
        with self._lock:
            self._records[record.job] = record
            self._by_folder[Path(record.dir).name] = record

    # -- heartbeat -------------------------------------------------------------------------
    def _beat(self) -> None:
        delay = BACKOFF_FIRST
        while not self._stop.is_set():
            try:
                sent = time.monotonic()
                answer = self.api.heartbeat(self._beat_body())
                said = answer.get("readyWindowSeconds")
                window = float(said) if isinstance(said, int | float) and said > 0 else READY_WINDOW
                with self._lock:
                    if self._accepted.is_set() and sent > self._lease_until:
                        # the lease ran out meanwhile: an answer the long poll gave before may
                        # place runs the server has since given elsewhere; only a newer one starts
                        self._fresh_after = sent
                    self._lease_until = sent + window
                delay = BACKOFF_FIRST
                self._accepted.set()
                self._relook.set()  # a start that waited for an accepted heartbeat is taken now
                self._pending.set()  # back after an outage: what waited is sent now
                # a quarter of the window at most: a lease renewed well before it runs out
                self._stop.wait(min(HEARTBEAT_INTERVAL, window / 4))
            except Stale as exc:  # refused: another agent serves this node
                stopped = self._stop_runs()
                self.failed = str(exc) + (f"; stopped the {stopped} run(s) this agent held" if stopped else "")
                self._stop.set()
                return
            except Unauthorized as exc:  # not worth retrying: the token is wrong until someone fixes it
                self.failed = (
                    f"the server refused this agent's token for node {self.options.node} ({exc}): give --token or "
                    f"--token-file with the token of an `agent {self.options.node}` line of the server's tokens file"
                )
                self.exit_code = 2
                self._stop.set()
                return
            except Unreachable as exc:
                if exc.status == 422 and "withdraws" in str(exc) and self._says_withdraws:
                    # a server of the version before takes no such field: its nodes free a
                    # stopped run at once, so this agent need not say it answers such stops
                    log.warning("the server takes no `withdraws` in a heartbeat (an older version): left out")
                    self._says_withdraws = False
                    continue
                log.warning("heartbeat failed: %s (again in %.1fs)", exc, delay)
                self._stop.wait(_jitter(delay))
                delay = min(delay * 2, BACKOFF_MAX)

    def _stop_runs(self) -> int:
        """This node is served by another agent now (taken over after a partition): the runs
        this one holds would go on unrecorded, so each is stopped as any run is (SIGTERM,
        SIGKILL after its grace period, by the stops thread) before the agent exits."""
        with self._lock:
            self._replaced = True  # checked under this lock before any start: none comes after this list
            live = [r for r in self._records.values() if not r.finished and r.identity is not None]
        for record in live:
            self._begin_stop(record, "Replaced")
        deadline = time.monotonic() + max((r.grace for r in live), default=0.0) + WRAPPER_GRACE + 1.0
        while any(not r.finished for r in live) and time.monotonic() < deadline:
            time.sleep(TICK)
        return len(live)

    def _await_acceptance(self) -> bool:
        """Wait for this agent's first accepted heartbeat; False when it stops first."""
        while not self._accepted.wait(TICK):
            if self._stop.is_set():
                return False
        return True

    def _beat_body(self) -> dict[str, Any]:
        capacity = {
            k: v
            for k, v in (("slots", self.options.slots), ("cpu", self.options.cpu), ("memory", self.options.memory))
            if v is not None
        }
        body: dict[str, Any] = {
            "agent": self.owner,
            "labels": self.options.labels,
            "capacity": capacity,
            "cpuCount": os.cpu_count() or 1,
            "address": self.address,
            **({"withdraws": True} if self._says_withdraws else {}),  # a stop of a run never started is answered
        }
        if self.logs is not None:
            body["logPort"] = self.logs.port
        return body

    # -- runs placed here ------------------------------------------------------------------
    def _follow(self) -> None:
        known, delay = "", BACKOFF_FIRST
        if not self._await_acceptance():
            return
        while not self._stop.is_set():
            try:
                answer = self.api.runs(known, LONG_POLL)
            except (Unreachable, Stale) as exc:
                log.warning("cannot follow the runs of node %s: %s (again in %.1fs)", self.options.node, exc, delay)
                self._stop.wait(_jitter(delay))
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_FIRST
            known = answer.get("digest", "")
            try:
                self.reconcile(answer.get("items", []))
            except Exception:  # one bad item must not end the agent's only way to learn of runs
                log.exception("acting on the runs placed on node %s failed", self.options.node)

    def reconcile(self, items: list[dict[str, Any]]) -> None:
        with self._reconciling:
            self._last_items, self._received = items, time.monotonic()
            self._reconcile(items)

    def _look_again(self) -> None:
        """A record settled, or a start went unanswered: an admission skipped meanwhile is looked at
        now, not at the long poll's next answer (which may be 30 s away)."""
        with self._reconciling:
            if self._skipped and self._last_items is not None:
                if self._received < self._fresh_after:  # from before the lease ran out: asked anew
                    try:
                        answer = self.api.runs("", 0)
                    except (Unreachable, Stale):
                        return  # the long poll brings it
                    self._last_items, self._received = answer.get("items", []), time.monotonic()
                self._reconcile(self._last_items)

    def _reconcile(self, items: list[dict[str, Any]]) -> None:
        placed: set[tuple[str, int, int]] = set()
        self._skipped = set()
        for item in items:
            placed.add((item["uid"], item["run"], item["epoch"]))
            with self._lock:
                record = self._records.get(item["job"])
            if record is not None and (record.uid, record.run, record.epoch) == (
                item["uid"],
                item["run"],
                item["epoch"],
            ):
                self._adopted_spec(record, item)
                if item.get("stop"):
                    self._begin_stop(record, item["stop"].get("reason"))
                continue
            if record is not None and not record.settled and record.identity is not None:
                self._skipped.add(item["job"])
                continue  # an older run of the job still ends here: the next waits for it (never two alive)
            if item.get("stop"):
                if not item.get("started"):
                    self._withdraw(item)  # stopped before it started here: it never will
                continue  # else a stop of a run this node has no record of: nothing runs to stop
            if not item.get("started"):
                if self._received >= self._fresh_after:
                    self._start(item)
                else:  # an answer from before the lease ran out: looked at again, asked anew
                    self._skipped.add(item["job"])
                    self._relook.set()
            elif not item.get("finished"):
                self._forgotten(item)
        with self._lock:
            unplaced = [r for r in self._records.values() if (r.uid, r.run, r.epoch) not in placed]
            for job, item in list(self._preparing.items()):
                if (item["uid"], item["run"], item["epoch"]) not in placed:
                    del self._preparing[job]
                    self.local.discard_work(self.local.run_dir(job, item["uid"], item["run"]))
        for record in unplaced:
            if record.settled:
                with self._lock:
                    self._records.pop(record.job, None)
                    self._by_folder.pop(Path(record.dir).name, None)
            elif not record.finished:
                # alive, and no longer placed here as far as the server says: report it, so
                # the server confirms it (200) or refuses it (409: then it is stopped)
                record.start_reported = False
                self._pending.set()

    def _withdraw(self, item: dict[str, Any]) -> None:
        """The server stopped a run this node has not started (a cancel, a deletion...) and
        holds its slots until told: it is reported as never started (Withdrawn), and no later
        look starts it (its record names the admission). A process found started before a
        crash, its record unwritten, is adopted and stopped instead."""
        job, uid, number, epoch = item["job"], item["uid"], item["run"], item["epoch"]
        run_dir = self.local.run_dir(job, uid, number)
        with self._lock:
            if self._preparing.pop(job, None) is not None:
                self.local.discard_work(run_dir)
        reason = str((item.get("stop") or {}).get("reason") or "a stop")
        grace = JobSpec.model_validate(item["spec"]).stop_grace_period
        record = Record(job, uid, number, epoch, str(run_dir), grace=grace)
        earlier = load(run_dir)
        # under the lock from the look to the record kept: an artifact-ready start waits, then finds it
        with self._lock:
            if self._replaced:
                return  # another agent serves the node now (_stop_runs)
            current = self._records.get(job)
            if current is not None and (current.uid, current.run, current.epoch) == (uid, number, epoch):
                record = current  # an artifact-ready start took it first: stopped as a started run
                identity, ended_before = current.identity, False
            else:
                identity = self.local.find(run_dir)
                ours = earlier is None or earlier.epoch == epoch  # else an exit left by an earlier admission's run
                ended_before = identity is None and ours and self.local.exit_of(run_dir) is not None
                run_dir.mkdir(parents=True, exist_ok=True)
                if identity is not None:
                    record.pid, record.process_start_time = identity.pid, identity.start_time
                    record.started_at = from_epoch(self.local.started_at(identity))
                    record.cgroup = self.local.existing_cgroup(job, uid, number)  # found by name, as _start does
                elif ended_before:  # it ran and ended while this agent was down: its start and end are reported
                    record.started_at = from_epoch(time.time())
                else:
                    record.start_failed = f"stopped ({reason}) before it started on node {self.options.node}"
                    record.start_reason, record.finished_at = "Withdrawn", from_epoch(time.time())
                record.save()
                self._records[job] = record
                self._by_folder[run_dir.name] = record
                if identity is not None:
                    self.local.watch(job, identity)
        if identity is not None:
            self._begin_stop(record, reason)
        elif ended_before:
            self._record_end(record)
        self._pending.set()

    def _start(self, item: dict[str, Any]) -> None:
        job, uid, number, epoch = item["job"], item["uid"], item["run"], item["epoch"]
        spec = JobSpec.model_validate(item["spec"])
        run_dir = self.local.run_dir(job, uid, number)
        earlier = load(run_dir)
        if earlier is not None and earlier.epoch != epoch:
            # the same run number admitted again (its first admission was given up before it
            # was known to start): the earlier process must be gone first, then its folder is
            # reused with no record of it
            if earlier.identity is not None and self.local.alive(earlier.identity):
                return  # being stopped (its report was refused); the next answer looks again
            (run_dir / "exit").unlink(missing_ok=True)
        if spec.working_dir and spec.artifact is None and not os.path.isdir(spec.working_dir):
            # the manifest's folder on the machine it was applied from, which this one lacks:
            # the run works in its own folder here
            run_dir.mkdir(parents=True, exist_ok=True)
            spec = spec.model_copy(update={"working_dir": str(run_dir)})
        record = Record(job, uid, number, epoch, str(run_dir), grace=spec.stop_grace_period)
        if spec.artifact is not None and self.local.find(run_dir) is None and self.local.exit_of(run_dir) is None:
            # fetched and unpacked by the agent's own threads; `_exited(job)` is called when
            # it is ready (or cannot be), and the start is taken again then
            prep = self.local.prepare(job, run_dir, spec.artifact)
            if prep.state in ("started", "pending"):
                with self._lock:
                    self._preparing[job] = item
                return
            with self._lock:
                self._preparing.pop(job, None)
            if prep.state == "failed":
                record.start_failed, record.finished_at = prep.message, from_epoch(time.time())
                record.start_reason, record.retryable = prep.reason, prep.retryable
                run_dir.mkdir(parents=True, exist_ok=True)
                record.save()
                self._keep(record)
                self._pending.set()
                return
        # under the lock until the record is kept: the exit watcher's call for a run that
        # ends at once waits for it, and finds it
        with self._lock:
            current = self._records.get(job)
            if current is not None and (current.uid, current.run, current.epoch) == (uid, number, epoch):
                return  # this admission has a record already: withdrawn while its artifact was fetched
            if self._replaced:
                return  # another agent serves the node now (_stop_runs): this one starts nothing
            identity = self.local.find(run_dir)  # started before a crash, its record not yet written
            if identity is not None:  # its cgroup, if one was made, is found by name
                record.cgroup = self.local.existing_cgroup(job, uid, number)
            ended_before = identity is None and self.local.exit_of(run_dir) is not None
            if identity is None and not ended_before:
                if time.monotonic() >= self._lease_until:
                    # no heartbeat accepted within the server's Ready window: another host's agent
                    # may serve the node now. It waits for the next accepted one (_relook)
                    log.warning("run %d of job %s waits for an accepted heartbeat to start", number, job)
                    self._skipped.add(job)
                    return
                try:
                    started = self.local.start(job, uid, number, spec, int(item.get("revision") or 1))
                    identity = started.identity
                    record.cgroup, record.limits, record.degraded = started.cgroup, started.limits, started.degraded
                except StartFailed as exc:
                    run_dir.mkdir(parents=True, exist_ok=True)
                    record.start_failed, record.finished_at = str(exc), from_epoch(time.time())
                    identity = None
                except ForkServerUnsure:  # it may have started: the next look finds it, or starts it
                    log.warning("run %d of job %s: its start is not known; looked for again", number, job)
                    self._skipped.add(job)
                    self._relook.set()
                    return
            if identity is not None:
                record.pid, record.process_start_time = identity.pid, identity.start_time
                self._quiet_until[record.dir] = time.monotonic() + START_REPORT_DELAY
                record.started_at = from_epoch(self.local.started_at(identity))
                self.local.trim_logs(run_dir, spec.kept_log_bytes)
                self.local.watch(job, identity)  # calls back (soon, if it has already ended)
            elif ended_before:  # it ran and ended while this agent was down, before its record was written
                record.started_at = from_epoch(time.time())
            record.save()
            self._records[job] = record
            self._by_folder[run_dir.name] = record
        if ended_before:
            self._record_end(record)
        self._specified.add(record.dir)
        self._probe_readiness(item)
        self._pending.set()
        log.info("run %d of job %s started (pid %s)", number, job, record.pid)

    def _adopted_spec(self, record: Record, item: dict[str, Any]) -> None:
        """Once per run this process did not start (adopted after a restart): what its spec
        asks of the node, its log limit and its readiness probe."""
        if record.dir in self._specified:
            return
        self._specified.add(record.dir)
        if not record.finished:
            self.local.trim_logs(Path(record.dir), JobSpec.model_validate(item["spec"]).kept_log_bytes)
        self._probe_readiness(item)

    def _probe_readiness(self, item: dict[str, Any]) -> None:
        spec = item["spec"]
        if spec.get("type") != "service" or not spec.get("readiness"):
            return
        parsed = JobSpec.model_validate(spec)
        assert parsed.readiness is not None
        with self._lock:
            self._readiness[item["job"]] = (item["uid"], parsed.readiness.as_wait_probe(), parsed.host_dir, parsed.env)

    def _forgotten(self, item: dict[str, Any]) -> None:
        """The server holds a start of this run, and this node has no record of it (its state
        dir was lost): the process is gone without a record, as far as anyone can prove."""
        run_dir = self.local.run_dir(item["job"], item["uid"], item["run"])
        if self.local.find(run_dir) is not None:
            return  # alive after all (a record lost, not the run): leave it be
        run_dir.mkdir(parents=True, exist_ok=True)
        record = Record(item["job"], item["uid"], item["run"], item["epoch"], str(run_dir), start_reported=True)
        record.gone, record.finished_at = True, from_epoch(time.time())
        record.save()
        self._keep(record)
        self._pending.set()

    # -- ends ------------------------------------------------------------------------------
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

    # -- stops -----------------------------------------------------------------------------
    def _begin_stop(self, record: Record, reason: str | None) -> None:
        identity = record.identity
        if record.stop_at is not None or record.finished or identity is None:
            return
        record.stop_at = time.monotonic()
        if reason in ("RunTimeout", "DeadlineExceeded"):
            self.local.note_stderr(Path(record.dir), "job timed out")
        log.info("stopping run %d of job %s (%s)", record.run, record.job, reason or "asked")
        self.local.terminate(identity, record.cgroup)

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            if self._relook.is_set():
                self._relook.clear()
                self._look_again()
            self._look_at_probes()
            with self._lock:
                stopping = [r for r in self._records.values() if r.stop_at is not None and not r.finished]
            now = time.monotonic()
            for record in stopping:
                identity = record.identity
                assert record.stop_at is not None and identity is not None
                if not self.local.alive(identity):
                    self._exited(record.job)
                elif now >= record.stop_at + record.grace:
                    self.local.kill(
                        identity, record.cgroup, wrapper_too=now >= record.stop_at + record.grace + WRAPPER_GRACE
                    )

    def _look_at_probes(self) -> None:
        """Each live service's readiness probe, run here at its interval (Probes); a verdict
        that changed is reported."""
        with self._lock:
            probed = [(r, self._readiness.get(r.job)) for r in self._records.values() if r.job in self._readiness]
        for record, readiness in probed:
            assert readiness is not None
            uid, cond, cwd, env = readiness
            if record.finished or uid != record.uid:
                with self._lock:
                    self._readiness.pop(record.job, None)
                self.probes.forget(record.job)
                continue
            verdict = self.probes.verdict(record.job, uid, cond, cwd, env)
            if verdict is not None and verdict[0] != record.ready:
                record.ready, record.ready_message = verdict[0], verdict[1]
                record.start_reported = False  # reported again, with the verdict
                self._pending.set()

    # -- reports ---------------------------------------------------------------------------
    def _report(self) -> None:
        delay, wait = BACKOFF_FIRST, None
        if not self._await_acceptance():
            return
        while not self._stop.is_set():
            self._pending.wait(wait)
            self._pending.clear()
            now, wait = time.monotonic(), None
            with self._lock:
                due = []
                for r in self._records.values():
                    if r.stale or not (not r.start_reported or (r.finished and not r.end_reported)):
                        continue
                    quiet = self._quiet_until.get(r.dir)
                    if quiet is not None and not r.finished and now < quiet:
                        wait = quiet - now if wait is None else min(wait, quiet - now)
                        continue  # a start only: it waits a moment for its end
                    due.append(r)
            due.sort(key=lambda r: not r.finished)  # ends first: each frees a slot for the next run
            for i in range(0, len(due), REPORT_BATCH):
                batch = due[i : i + REPORT_BATCH]
                finished = [r.finished for r in batch]  # what each report says, whatever the watcher adds meanwhile
                try:
                    kept = self._send(batch)
                except (Unreachable, Stale) as exc:  # Stale: not this node's agent now (the heartbeat says)
                    log.warning("reports of %d run(s) failed: %s (again in %.1fs)", len(batch), exc, delay)
                    self._stop.wait(_jitter(delay))
                    delay = min(delay * 2, BACKOFF_MAX)
                    self._pending.set()
                    break
                delay = BACKOFF_FIRST
                for record, ended, refused in zip(batch, finished, kept, strict=True):
                    self._quiet_until.pop(record.dir, None)
                    if refused is None:
                        record.start_reported = True
                        record.end_reported = ended
                    else:
                        log.warning("run %d of job %s: %s", record.run, record.job, refused)
                        record.stale = True
                        self._begin_stop(record, "Stale")
                    if record.settled:  # a start reported again after a restart costs nothing: not saved for
                        record.save()
                        self._relook.set()

    def _send(self, batch: list[Record]) -> list[str | None]:
        """The reports of `batch` in one request (the server keeps them in one transaction),
        or one request each to a server without the batch route; per record, None when it
        was kept, else why it was refused as stale."""
        if self._batches:
            try:
                return self.api.reports([{"job": r.job, **r.report()} for r in batch])
            except Unreachable as exc:
                if exc.status not in (404, 405):
                    raise
                self._batches = False  # an older server: a report per request from now on
        kept: list[str | None] = []
        for record in batch:
            try:
                self.api.report(record.job, record.report())
                kept.append(None)
            except Stale as exc:
                kept.append(str(exc))
        return kept


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


def default_state_dir(node: str) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "reconciler" / f"agent-{node}"


def _jitter(delay: float) -> float:
    return delay * (0.8 + 0.4 * random.random())


def _route_to(server: str) -> str:
    """The address of this machine on the way to the server: where the server reaches its
    log port and the registry sends clients of its services."""
    url = urlsplit(server)
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
    try:
        family = socket.getaddrinfo(host, port)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # a UDP connect sends nothing: the kernel picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
