"""A placed run this node has no record of: started under the run wrapper (after its
artifact is fetched, and only within the lease), withdrawn when it was stopped before it
started, or recorded gone when the server holds it started and its record is lost; and,
once per run, what its spec asks of the node (its log limit, its readiness probe)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ..agent.forkserver import ForkServerUnsure
from ..agent.local import StartFailed
from ..api.job import JobSpec
from ..api.meta import from_epoch
from .records import Record, load
from .shared import Shared

log = logging.getLogger("reconciler.agent")

# A start is reported this long after it, unless the run ends before: a short run's start
# and end then go in one report, which the server writes in one step. An end goes at once.
START_REPORT_DELAY = float(os.environ.get("RECONCILER_START_REPORT_DELAY", "0.05"))


class Starts(Shared):
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
        record = Record(job, uid, number, epoch, str(run_dir), grace=grace, node_uid=self._node_uid)
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
        record = Record(job, uid, number, epoch, str(run_dir), grace=spec.stop_grace_period, node_uid=self._node_uid)
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
        record = Record(
            item["job"],
            item["uid"],
            item["run"],
            item["epoch"],
            str(run_dir),
            start_reported=True,
            node_uid=self._node_uid,
        )
        record.gone, record.finished_at = True, from_epoch(time.time())
        record.save()
        self._keep(record)
        self._pending.set()
