"""Steps of a job whose process may be alive: Starting (spawn or adopt) and Running (watch,
time out). A run that is over or must stop goes to `RunEnds` (runends.py): Stopping, the
record of its end, and where the job goes next.

Process facts come from the agent: the wrapper's exit record, the process identity (pid +
start time). A job never completes while a process of its run is known alive."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..agent.local import (
    LocalAgent,
    ProcessIdentity,
    Started,
    StartFailed,
)
from ..agent.probe import Probes
from ..api.annotations import LOST_RUN
from ..api.meta import from_epoch, to_epoch
from ..api.node import heartbeat_fresh
from ..api.source import shown_url
from ..api.status import Phase, RunDict, RunOutcome
from ..clock import Clock
from ..store import Store
from ..store import repository as repo
from ..store import scheduling as sched
from ..store.transactions import Fenced
from . import deadlines, faults
from .context import Ctx
from .endings import Endings
from .owners import released
from .remote import RemoteSteps
from .retry import RunEnd
from .runends import OTHER_AGENT_POLL, STOP_POLL, RunEnds, run_identity
from .runtime import AGAIN, Result, requeue_after
from .services import ServiceSteps, sooner
from .spawns import PENDING, Spawned, SpawnFailed, Spawns
from .stops import Stop, drained
from .transitions import set_condition

if TYPE_CHECKING:
    from ..agent.artifacts import Preparation

ORPHAN_POLL = 1.0  # a run whose wrapper was killed while its group lives on: look this often
# A run spawned here is written Running once it has lived this long, or with its end if that
# comes first: a short run's start and end are one status write, not two. Until then the job
# shows Starting; a crash meanwhile finds the run by its folder, as after any spawn.
START_REPORT = 0.2


class RunSteps:
    def __init__(
        self,
        store: Store,
        agent: LocalAgent,
        endings: Endings,
        probes: Probes,
        *,
        owner: str,
        rand: random.Random,
        clock: Clock,
        wake: Callable[..., None],
    ):
        self.store = store
        self.agent = agent
        self.endings = endings
        self.probes = probes
        self.owner = owner
        self.rand = rand
        self.clock = clock
        self.remote = RemoteSteps(self)
        self.services = ServiceSteps(self)
        self.ends = RunEnds(self)
        self.spawns = Spawns(store, wake)  # plain runs started off this thread, after their admission's commit
        # jobs whose spawn aside raised (not StartFailed): spawned in the step until one
        # succeeds, so that an error that persists is retried with the runner's growing backoff
        self.spawn_inline: set[str] = set()

    def step(self, ctx: Ctx) -> Result:
        if ctx.phase == Phase.STARTING:
            return self.starting(ctx)
        if ctx.phase == Phase.RUNNING:
            return self.running(ctx)
        return self.ends.stopping(ctx)

    def stop_reason(self, ctx: Ctx) -> Stop | None:
        """Why a live run must stop now, in order of precedence."""
        if ctx.obj.deleted_at is not None:
            return "Deleted", "the job is being deleted"
        if ctx.cancel_requested():
            return "Cancelled", ctx.cancel_message()
        if deadlines.passed(ctx.job_deadline(), ctx.now):
            return "DeadlineExceeded", f"the job exceeded its timeout of {ctx.spec.timeout:g}s"
        run = ctx.open_run()
        if run is not None and (lost := drained(ctx, run["number"], run.get("node"))) is not None:
            return lost
        if ctx.spec.suspend:
            return "Suspended", "suspended"
        if ctx.spec_changed():
            return "SpecChanged", "the spec changed (apply --force)"
        return None

    def node_served(self, node: str | None, now: float) -> bool:
        """Whether a live agent serves `node` (its heartbeat is fresh). A run there is that
        agent's to stop; on a node nobody serves, `drain --force` alone proves it gone."""
        if node == self.agent.node:
            return True
        if node is None:
            return False
        with self.store.read() as session:
            obj = repo.get(session, kind="Node", name=node)
        return obj is not None and heartbeat_fresh(obj.status, now)

    def run_dir(self, ctx: Ctx, number: int) -> Path:
        return self.agent.run_dir(ctx.name, ctx.uid, number)

    # -- Starting ------------------------------------------------------------------------
    def starting(self, ctx: Ctx) -> Result:
        spawned = self.spawns.take(ctx.uid)
        if spawned is PENDING:
            return requeue_after(START_REPORT)  # woken when it is done
        if isinstance(spawned, Spawned | SpawnFailed) and all(
            r["number"] != spawned.number for r in ctx.status.get("runs", [])
        ):
            if isinstance(spawned, SpawnFailed) and isinstance(spawned.error, StartFailed):
                return self._start_failed(ctx, spawned.number, spawned.error)
            if isinstance(spawned, SpawnFailed):
                # e.g. ForkServerUnsure: the next step looks for the run first, and spawns
                # in the step if it must, so that each failure counts towards the backoff
                self.spawn_inline.add(ctx.uid)
                raise spawned.error
            if (wait := self._young(ctx, spawned)) > 0:
                self.spawns.keep(ctx.uid, spawned)  # its start is written with its end, or at START_REPORT
                return requeue_after(deadlines.soonest(ctx.now, ctx.now + wait, ctx.job_deadline()))
            return self._report_start(ctx, spawned)
        held = self.endings.admitted.pop(ctx.uid, None)
        if held is not None and held.node != self.agent.node and not self.store.uncommitted(ctx.uid):
            held = None  # committed: another node's agent may have reported on it since, read below
        if held is None and (reported := self.store.reported(ctx.uid)) is not None and reported.node != self.agent.node:
            held = reported  # a report handed to this batch: its admission as the report left it
        if held is None:
            with self.store.read() as session:
                held = sched.admission(session, ctx.uid)
        if held is None:  # cannot happen through the transition table; recover by queueing again
            ctx.move(Phase.QUEUED, "AdmissionLost", "no admission found for a starting job; queued again")
            self.endings.enqueue(ctx)
            self.endings.write(ctx)
            return AGAIN
        if held.node != self.agent.node and (node := self.remote.node(held.node, ctx.now)) is not None:
            return self.remote.starting(ctx, held, node)  # its agent starts it and reports
        if held.node != self.agent.node:
            lost = drained(ctx, held.run_number, held.node)
            if lost is not None and not self.node_served(held.node, ctx.now):
                return self.unstarted(ctx, lost)
            return requeue_after(OTHER_AGENT_POLL)  # another node's agent starts it
        if not self._claim(ctx, held):
            # another live controller owns this spawn: it starts the run (or already has, and
            # records it); adopting that process from here would race it for the record
            return requeue_after(OTHER_AGENT_POLL)
        number, run_dir = held.run_number, self.run_dir(ctx, held.run_number)
        identity = self.agent.find(run_dir)
        exited = self.agent.exit_of(run_dir)
        started_at = None  # now, unless an adopted process tells when it really started
        started: Started | None = None
        if identity is None and exited is None:
            if (stop := self.stop_reason(ctx)) is not None:
                self.spawn_inline.discard(ctx.uid)
                if ctx.spec.artifact is not None:
                    self.agent.discard_work(run_dir)  # a fetch or an unpacked folder nobody will use
                self._unused_cgroup(ctx, number, run_dir)
                return self.ends.after_stop(ctx, stop, run=None)
            if (lost := drained(ctx, number, held.node)) is not None:
                self.spawn_inline.discard(ctx.uid)
                if ctx.spec.artifact is not None:
                    self.agent.discard_work(run_dir)  # its next admission may be on another node
                self._unused_cgroup(ctx, number, run_dir)
                return self.unstarted(ctx, lost)
            if ctx.spec.artifact is not None and (not_yet := self._artifact(ctx, number, run_dir)) is not None:
                return not_yet
            plain = ctx.spec.type != "service" and ctx.spec.readiness is None and not ctx.changed()
            if plain and ctx.uid not in self.spawn_inline:
                return self._spawn_aside(ctx, number, held.node)
            if self.store.uncommitted(ctx.uid):
                # a process exists only under a committed admission (and claim): a crash after
                # the spawn must find them
                self.store.flush()
            faults.point("after-admission")
            self.leading()
            try:
                started = self.agent.start(ctx.name, ctx.uid, number, ctx.spec, ctx.revision)
                identity = started.identity
                faults.point("after-spawn")
            except StartFailed as exc:
                self.spawn_inline.discard(ctx.uid)
                return self._start_failed(ctx, number, exc)
            self.spawn_inline.discard(ctx.uid)
        elif identity is not None:  # spawned before a crash: adopt it, with its real start (runTimeout counts from it)
            self.agent.watch(ctx.name, identity)
            started_at = from_epoch(min(self.agent.started_at(identity), ctx.now))
        crash_loop = ctx.status.get("reason") == "CrashLoop"  # a service restarted after a short run
        reason = "CrashLoop" if crash_loop else "Started"
        run = self._record_start(ctx, number, held.node, identity, started_at, started, reason)
        self.endings.write(ctx)
        if identity is not None and started_at is None and ctx.spec.type != "service":
            # just spawned here and watched: the exit watcher wakes the job when it ends, so
            # only the deadlines need a timer (a Running step now would find it alive); a
            # service's Running step also sets its probe and crash-loop timers
            run_deadline = deadlines.run_deadline(ctx.spec, to_epoch(run["startedAt"]))
            return requeue_after(deadlines.soonest(ctx.now, run_deadline, ctx.job_deadline()))
        return AGAIN

    def _spawn_aside(self, ctx: Ctx, number: int, node: str) -> Result:
        """A plain run (no service, no readiness probe) started by the spawns thread once
        this batch commits (a process exists only under a committed admission and claim: a
        crash after the spawn must find them). Its exit wakes the job, whose next step
        writes start and end together; a run still going at START_REPORT is written Running
        then."""
        name, uid, spec, revision = ctx.name, ctx.uid, ctx.spec, ctx.revision

        def spawn() -> Spawned:
            faults.point("after-admission")
            self.leading()
            started_at = from_epoch(self.clock.now())
            started = self.agent.start(name, uid, number, spec, revision)
            faults.point("after-spawn")
            return Spawned(number, started, started_at, node, self.clock.now())

        self.spawns.ask(uid, name, number, spawn)
        run_deadline = deadlines.run_deadline(spec, ctx.now)
        return requeue_after(deadlines.soonest(ctx.now, ctx.now + START_REPORT, run_deadline, ctx.job_deadline()))

    def _young(self, ctx: Ctx, spawned: Spawned) -> float:
        """Seconds until a run spawned aside has lived START_REPORT, when it still lives and
        nothing asks it to stop: a step woken by its spawn's end (one that found it pending
        asked for that) leaves its start to be written with its end, as for a spawn in the
        step. 0 when its start is to be written now."""
        left = spawned.spawned_at + START_REPORT - ctx.now
        if left <= 0 or self.stop_reason(ctx) is not None:
            return 0.0
        return left if self.agent.wrapper_alive(spawned.started.identity) else 0.0

    def _start_failed(self, ctx: Ctx, number: int, exc: StartFailed) -> Result:
        run = self.new_run(ctx, number, None)
        end = RunEnd(RunOutcome.START_FAILED)
        return self.ends.finish(ctx, run, end, exit_code=None, reason="StartFailed", message=str(exc))

    def _report_start(self, ctx: Ctx, spawned: Spawned) -> Result:
        """The start of a run spawned here, written now: alone while the run lives (the
        Running step takes it from there), with its end when it is over."""
        identity = spawned.started.identity
        run = self._record_start(ctx, spawned.number, spawned.node, identity, spawned.started_at, spawned.started)
        if self.agent.alive(identity, run.get("cgroup")):
            self.endings.write(ctx)
            return AGAIN
        return self.ends.ended(ctx, run, self.agent.exit_of(self.run_dir(ctx, spawned.number)))

    def _record_start(
        self,
        ctx: Ctx,
        number: int,
        node: str,
        identity: ProcessIdentity | None,
        started_at: str | None,
        started: Started | None,
        reason: str = "Started",
    ) -> RunDict:
        """The run's record, its limits, and the move to Running (not yet written)."""
        run = self.new_run(ctx, number, identity, started_at)
        self._limits(ctx, run, started)
        ctx.status.setdefault("startTime", run["startedAt"])
        if ctx.spec.readiness is not None:  # not ready until this run's first probe passes
            ctx.status["ready"] = False
            set_condition(ctx.status, "Ready", False, "ProbePending", "no readiness probe has passed yet", ctx.now_text)
        pid = f" (pid {identity.pid})" if identity else ""
        ctx.move(Phase.RUNNING, reason, f"run {number} started on {node}{pid}", event="Started")
        return run

    def _artifact(self, ctx: Ctx, number: int, run_dir: Path) -> Result | None:
        """None once the run's artifact is unpacked in its folder. Until then the agent
        fetches and unpacks it beside the loop and wakes the job when done; the job stays
        Starting, its slots held. A failure ends the run StartFailed before its command
        starts, with reason ArtifactInvalid: retried per spec.retry only when the URL could
        not be reached."""
        assert ctx.spec.artifact is not None
        prep = self.agent.prepare(ctx.name, run_dir, ctx.spec.artifact)
        if prep.state == "ready":
            return None
        if prep.state == "failed":
            return self._artifact_failed(ctx, number, prep)
        if prep.state == "started":
            # events are stored and shown to every reader: no password in them
            url = shown_url(ctx.spec.artifact.url)
            ctx.note("FetchingArtifact", f"run {number}: fetching {url} and unpacking it")
            self.endings.write(ctx)
        return requeue_after(deadlines.soonest(ctx.now, ctx.job_deadline()))

    def _artifact_failed(self, ctx: Ctx, number: int, prep: Preparation) -> Result:
        run = self.new_run(ctx, number, None)
        message = prep.message
        if prep.retryable and ctx.spec.type != "service":  # a service is restarted without a limit
            message += f" (attempt {len(ctx.runs_this_revision())} of {ctx.spec.retry.limit + 1})"
        end = RunEnd(RunOutcome.START_FAILED, reason=prep.reason, retryable=prep.retryable)
        return self.ends.finish(ctx, run, end, exit_code=None, reason=prep.reason, message=message)

    def _claim(self, ctx: Ctx, held: sched.Admission) -> bool:
        """Only one agent may start (or adopt) a given admission's run, even with two
        controllers: the unclaimed spawn, or that of an owner proven gone (a crash)."""
        if held.owner == self.owner:
            return True  # claimed at admission
        if held.owner is not None and not released(held.owner, self.owner):
            return False
        with self.store.write(known=True) as tx:
            tx.store.mark(ctx.uid)
            return sched.claim_spawn(tx, ctx.uid, self.owner, take_over_from=held.owner)

    def leading(self) -> None:
        """Before acting on processes (no write to fence it): a server that may have lost
        the controller lease unseen (paused past its period) acts on nothing."""
        fence = self.store.fence
        if fence is not None and not fence.holds():
            raise Fenced("this server may no longer hold the controller lease: it acts on no process")

    def new_run(
        self,
        ctx: Ctx,
        number: int,
        identity: ProcessIdentity | None,
        started_at: str | None = None,
        *,
        node: str | None = None,
    ) -> RunDict:
        run: RunDict = {
            "number": number,
            "revision": ctx.revision,
            "node": node or self.agent.node,
            "startedAt": started_at or ctx.now_text,
        }
        if identity is not None:
            run["pid"], run["processStartTime"] = identity.pid, identity.start_time
        ctx.status.setdefault("runs", []).append(run)
        return run

    def _limits(self, ctx: Ctx, run: RunDict, started: Started | None) -> None:
        """How the run's resources are held: its cgroup (found again for a run adopted after a
        crash), or the fallback, which the job's LimitsEnforced condition then tells."""
        if started is None:  # adopted: spawned before a crash, its cgroup kept by name
            cgroup = self.agent.existing_cgroup(ctx.name, ctx.uid, run["number"])
            if cgroup is not None:
                run["cgroup"], run["limits"] = cgroup, f"cgroup {self.agent.cgroup_version}"
            return
        run["limits"] = started.limits
        if started.cgroup is not None:
            run["cgroup"] = started.cgroup
        if started.degraded is not None:
            message = (
                f"run {run['number']}: limits are degraded, no cgroup could be made ({started.degraded}); "
                "memory is an address-space rlimit and CPU is not limited"
            )
            set_condition(ctx.status, "LimitsEnforced", False, "LimitsDegraded", message, ctx.now_text)
        elif any(c.get("type") == "LimitsEnforced" for c in ctx.status.get("conditions", [])):
            message = f"run {run['number']} is held by its {started.limits}"
            set_condition(ctx.status, "LimitsEnforced", True, "Cgroup", message, ctx.now_text)

    def _unused_cgroup(self, ctx: Ctx, number: int, run_dir: Path) -> None:
        """The run will not start: a cgroup kept for it (a start the fork server left
        unanswered, found not to have happened) is removed. Nothing to look at for a run
        that never had a folder."""
        if run_dir.exists():
            self.agent.remove_cgroup(self.agent.existing_cgroup(ctx.name, ctx.uid, number))

    def unstarted(self, ctx: Ctx, lost: Stop) -> Result:
        """`drain --force` reached an admission whose run never started: the run does not
        start there. Not an attempt (no process ran): the slots go back and the job returns
        to its old place in line. The request is spent with this write, for the next
        admission will carry the same run number."""
        self.ends.release(ctx)
        ctx.annotations = {k: v for k, v in ctx.obj.annotations.items() if k != LOST_RUN}
        message = f"{lost[1]}; it had not started, so it goes back in line"
        ctx.move(Phase.QUEUED, "NodeDrained", message)
        self.endings.enqueue(ctx)
        self.endings.write(ctx)
        return AGAIN

    # -- Running -------------------------------------------------------------------------
    def running(self, ctx: Ctx) -> Result:
        run = ctx.open_run()
        if run is None:
            if ctx.spec.type == "service":
                return self.services.restart_due(ctx)
            raise RuntimeError(f"job {ctx.name} is Running without an open run")
        if run.get("node") != self.agent.node and (node := self.remote.node(run.get("node"), ctx.now)) is not None:
            return self.remote.running(ctx, run, node)
        if run.get("node") != self.agent.node:
            lost = drained(ctx, run["number"], run.get("node"))
            if lost is not None and not self.node_served(run.get("node"), ctx.now):
                return self.ends.after_stop(ctx, lost, run=run)  # nobody to stop it: the operator's word suffices
            return requeue_after(OTHER_AGENT_POLL)  # only the run's own agent can see its processes
        identity, run_dir = run_identity(run), self.run_dir(ctx, run["number"])
        cgroup = run.get("cgroup")
        alive = identity is not None and self.agent.alive(identity, cgroup)
        exited = self.agent.exit_of(run_dir)
        if identity is None or not alive:
            return self.ends.ended(ctx, run, exited)
        self.agent.trim_logs(run_dir, ctx.spec.kept_log_bytes)  # again after a restart: the run outlived us
        # A wrapper killed from outside leaves its group orphaned: nothing will tell when the
        # rest ends (a pidfd of a dead process fires at once), so it is looked at on a timer.
        orphaned = not self.agent.wrapper_alive(identity)
        if not orphaned:
            self.agent.watch(ctx.name, identity)  # the exit watcher wakes the job when it ends
        if exited is not None and not self.agent.leftovers(identity, cgroup):
            return requeue_after(STOP_POLL)  # the wrapper is writing its record and about to exit; the watcher wakes us
        if exited is not None:  # the command exited but left processes in its group
            return self.ends.begin_stop(
                ctx, identity, ("Exited", "the command exited; stopping what it left running"), cgroup
            )
        stop = self.stop_reason(ctx)
        run_deadline = deadlines.run_deadline(ctx.spec, to_epoch(run["startedAt"]))
        if stop is None and deadlines.passed(run_deadline, ctx.now):
            stop = ("RunTimeout", f"run {run['number']} exceeded its runTimeout of {ctx.spec.run_timeout:g}s")
        if stop is not None:
            return self.ends.begin_stop(ctx, identity, stop, cgroup)
        due = deadlines.soonest(ctx.now, run_deadline, ctx.job_deadline())
        if ctx.spec.type == "service":
            due = sooner(due, self.services.health(ctx, run))
        if orphaned:
            return requeue_after(ORPHAN_POLL if due is None else min(due, ORPHAN_POLL))
        return requeue_after(due)
