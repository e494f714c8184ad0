"""Steps of a job whose process may be alive: Starting (spawn or adopt), Running (watch,
time out), Stopping (SIGTERM, then SIGKILL after the grace period), and what follows a run.

Process facts come from the agent: the wrapper's exit record, the process identity (pid +
start time). A job never completes while a process of its run is known alive."""

from __future__ import annotations

import random
from pathlib import Path

from ..agent.local import ExitRecord, LocalAgent, ProcessIdentity, StartFailed, owner_gone
from ..api.meta import from_epoch, to_epoch
from ..api.status import Phase, RunDict, RunOutcome
from ..store import Store
from ..store import scheduling as sched
from . import deadlines, faults
from .context import RETRY_SCHEDULED, Ctx
from .endings import Endings
from .retry import RunEnd, after_run
from .runtime import AGAIN, DONE, Result, requeue_after

STOP_POLL = 0.05  # while stopping, look this often (a stop lasts at most the grace period)
ORPHAN_POLL = 1.0  # a run whose wrapper was killed while its group lives on: look this often
WRAPPER_GRACE = 2.0  # after SIGKILL, how long the wrapper gets to record before it is killed too
OTHER_AGENT_POLL = 5.0

Stop = tuple[str, str]  # (reason, message)


class RunSteps:
    def __init__(self, store: Store, agent: LocalAgent, endings: Endings, *, owner: str, rand: random.Random):
        self.store = store
        self.agent = agent
        self.endings = endings
        self.owner = owner
        self.rand = rand

    def step(self, ctx: Ctx) -> Result:
        if ctx.phase == Phase.STARTING:
            return self.starting(ctx)
        if ctx.phase == Phase.RUNNING:
            return self.running(ctx)
        return self.stopping(ctx)

    def stop_reason(self, ctx: Ctx) -> Stop | None:
        """Why a live run must stop now, in order of precedence."""
        if ctx.obj.deleted_at is not None:
            return "Deleted", "the job is being deleted"
        if ctx.cancel_requested():
            return "Cancelled", ctx.cancel_message()
        if deadlines.passed(ctx.job_deadline(), ctx.now):
            return "DeadlineExceeded", f"the job exceeded its timeout of {ctx.spec.timeout:g}s"
        if ctx.spec.suspend:
            return "Suspended", "suspended"
        if ctx.spec_changed():
            return "SpecChanged", "the spec changed (apply --force)"
        return None

    def run_dir(self, ctx: Ctx, number: int) -> Path:
        return self.agent.run_dir(ctx.name, ctx.uid, number)

    # -- Starting ------------------------------------------------------------------------
    def starting(self, ctx: Ctx) -> Result:
        held = self.endings.admitted.pop(ctx.uid, None)
        if held is None:
            with self.store.read() as session:
                held = sched.admission(session, ctx.uid)
        if held is None:  # cannot happen through the transition table; recover by queueing again
            ctx.move(Phase.QUEUED, "AdmissionLost", "no admission found for a starting job; queued again")
            self.endings.enqueue(ctx)
            self.endings.write(ctx)
            return AGAIN
        if held.node != self.agent.node:
            return requeue_after(OTHER_AGENT_POLL)  # another node's agent starts it
        if not self._claim(ctx, held):
            # another live controller owns this spawn: it starts the run (or already has, and
            # records it); adopting that process from here would race it for the record
            return requeue_after(OTHER_AGENT_POLL)
        number, run_dir = held.run_number, self.run_dir(ctx, held.run_number)
        identity = self.agent.find(run_dir)
        exited = self.agent.exit_of(run_dir)
        started_at = None  # now, unless an adopted process tells when it really started
        if identity is None and exited is None:
            if (stop := self.stop_reason(ctx)) is not None:
                return self.after_stop(ctx, stop, run=None)
            faults.point("after-admission")
            try:
                identity = self.agent.start(ctx.name, ctx.uid, number, ctx.spec, ctx.revision)
                faults.point("after-spawn")
            except StartFailed as exc:
                run = self._new_run(ctx, number, None)
                return self.finish(
                    ctx, run, RunEnd(RunOutcome.START_FAILED), exit_code=None, reason="StartFailed", message=str(exc)
                )
        elif identity is not None:  # spawned before a crash: adopt it, with its real start (runTimeout counts from it)
            self.agent.watch(ctx.name, identity)
            started_at = from_epoch(min(self.agent.started_at(identity), ctx.now))
        run = self._new_run(ctx, number, identity, started_at)
        ctx.status.setdefault("startTime", run["startedAt"])
        pid = f" (pid {identity.pid})" if identity else ""
        ctx.move(Phase.RUNNING, "Started", f"run {number} started on {held.node}{pid}")
        self.endings.write(ctx)
        if identity is not None and started_at is None:
            # just spawned here and watched: the exit watcher wakes the job when it ends, so
            # only the deadlines need a timer (a Running step now would find it alive)
            run_deadline = deadlines.run_deadline(ctx.spec, to_epoch(run["startedAt"]))
            return requeue_after(deadlines.soonest(ctx.now, run_deadline, ctx.job_deadline()))
        return AGAIN

    def _claim(self, ctx: Ctx, held: sched.Admission) -> bool:
        """Only one agent may start (or adopt) a given admission's run, even with two
        controllers: the unclaimed spawn, or that of an owner proven gone (a crash)."""
        if held.owner == self.owner:
            return True  # claimed at admission
        if held.owner is not None and not owner_gone(held.owner):
            return False
        with self.store.write(known=True) as tx:
            return sched.claim_spawn(tx, ctx.uid, self.owner, take_over_from=held.owner)

    def _new_run(
        self, ctx: Ctx, number: int, identity: ProcessIdentity | None, started_at: str | None = None
    ) -> RunDict:
        run: RunDict = {
            "number": number,
            "revision": ctx.revision,
            "node": self.agent.node,
            "startedAt": started_at or ctx.now_text,
        }
        if identity is not None:
            run["pid"], run["processStartTime"] = identity.pid, identity.start_time
        ctx.status.setdefault("runs", []).append(run)
        return run

    # -- Running -------------------------------------------------------------------------
    def running(self, ctx: Ctx) -> Result:
        run = ctx.open_run()
        if run is None:
            raise RuntimeError(f"job {ctx.name} is Running without an open run")
        if run.get("node") != self.agent.node:
            return requeue_after(OTHER_AGENT_POLL)  # only the run's own agent can see its processes
        identity, run_dir = _identity(run), self.run_dir(ctx, run["number"])
        alive = identity is not None and self.agent.alive(identity)
        exited = self.agent.exit_of(run_dir)
        if identity is None or not alive:
            return self._ended(ctx, run, exited)
        self.agent.trim_logs(run_dir, ctx.spec.kept_log_bytes)  # again after a restart: the run outlived us
        # A wrapper killed from outside leaves its group orphaned: nothing will tell when the
        # rest ends (a pidfd of a dead process fires at once), so it is looked at on a timer.
        orphaned = not self.agent.wrapper_alive(identity)
        if not orphaned:
            self.agent.watch(ctx.name, identity)  # the exit watcher wakes the job when it ends
        if exited is not None and not self.agent.leftovers(identity):
            return requeue_after(STOP_POLL)  # the wrapper is writing its record and about to exit; the watcher wakes us
        if exited is not None:  # the command exited but left processes in its group
            return self._begin_stop(ctx, identity, ("Exited", "the command exited; stopping what it left running"))
        stop = self.stop_reason(ctx)
        run_deadline = deadlines.run_deadline(ctx.spec, to_epoch(run["startedAt"]))
        if stop is None and deadlines.passed(run_deadline, ctx.now):
            stop = ("RunTimeout", f"run {run['number']} exceeded its runTimeout of {ctx.spec.run_timeout:g}s")
        if stop is not None:
            return self._begin_stop(ctx, identity, stop)
        due = deadlines.soonest(ctx.now, run_deadline, ctx.job_deadline())
        if orphaned:
            return requeue_after(ORPHAN_POLL if due is None else min(due, ORPHAN_POLL))
        return requeue_after(due)

    def _ended(self, ctx: Ctx, run: RunDict, exited: ExitRecord | None) -> Result:
        faults.point("before-exit-record")
        if exited is None:
            return self.finish(
                ctx,
                run,
                RunEnd(RunOutcome.LOST, reason="ProcessLost"),
                exit_code=None,
                reason="ProcessLost",
                message=f"run {run['number']} ended without recording an exit status",
            )
        outcome = RunOutcome.SUCCEEDED if exited.exit_code == 0 else RunOutcome.FAILED
        return self.finish(
            ctx, run, RunEnd(outcome, exited.exit_code), exit_code=exited.exit_code, signal=exited.signal
        )

    def _begin_stop(self, ctx: Ctx, identity: ProcessIdentity, stop: Stop) -> Result:
        reason, message = stop
        self.agent.terminate(identity)
        ctx.status["stop"] = {
            "reason": reason,
            "message": message,
            "requestedAt": ctx.now_text,
            "killAt": ctx.now + ctx.spec.stop_grace_period,
        }
        ctx.move(
            Phase.STOPPING,
            reason if reason != "Exited" else "Cleanup",
            message,
            event="Stopping" if reason != "RunTimeout" else "RunTimeout",
        )
        self.endings.write(ctx)
        return requeue_after(STOP_POLL)

    # -- Stopping ------------------------------------------------------------------------
    def stopping(self, ctx: Ctx) -> Result:
        run, stop = ctx.open_run(), ctx.status.get("stop") or {}
        if run is not None and run.get("node") != self.agent.node:
            return requeue_after(OTHER_AGENT_POLL)
        identity = _identity(run) if run else None
        if run is not None and identity is not None and self.agent.alive(identity):
            self.agent.trim_logs(self.run_dir(ctx, run["number"]), ctx.spec.kept_log_bytes)
            kill_at = float(stop.get("killAt", ctx.now))
            if ctx.now >= kill_at:
                if not stop.get("killed"):
                    stop["killed"] = True
                    ctx.note(
                        "Killing",
                        f"grace period over; SIGKILL to the process group of run {run['number']}",
                        warning=True,
                    )
                    self.endings.write(ctx)
                self.agent.kill(identity, wrapper_too=ctx.now >= kill_at + WRAPPER_GRACE)
            return requeue_after(STOP_POLL)
        reason = (stop.get("reason", "Cancelled"), stop.get("message", ""))
        if run is None:
            return self.after_stop(ctx, reason, run=None)
        exited = self.agent.exit_of(self.run_dir(ctx, run["number"]))
        if reason[0] == "Exited":
            return self._ended(ctx, run, exited)
        return self.after_stop(ctx, reason, run=run, exited=exited)

    def after_stop(self, ctx: Ctx, stop: Stop, run: RunDict | None, exited: ExitRecord | None = None) -> Result:
        """The run (if any) is over and its processes are gone: record it, release the slots,
        then go where the stop reason leads."""
        reason, message = stop
        if run is not None:
            if reason in ("RunTimeout", "DeadlineExceeded"):
                self._timed_out(ctx, run)
                self._close_run(ctx, run, RunOutcome.TIMED_OUT, -1, None, reason)
            else:
                code = exited.exit_code if exited else None
                self._close_run(ctx, run, RunOutcome.CANCELLED, code, exited.signal if exited else None, reason)
        self._release(ctx)
        ctx.status.pop("stop", None)
        if reason == "RunTimeout":
            return self._decide(ctx, RunEnd(RunOutcome.TIMED_OUT, -1), message)
        if reason == "Deleted":
            return self.endings.finalize_delete(ctx)
        if reason == "Suspended":
            ctx.move(
                Phase.SUSPENDED, "Suspended", "suspended; the run was stopped and the job keeps its queue position"
            )
            self.endings.write(ctx)
            return DONE
        if reason == "SpecChanged":
            return self.endings.start_revision(ctx)
        outcome = "TimedOut" if reason == "DeadlineExceeded" else "Cancelled"
        return self.endings.complete(ctx, outcome, reason, message)

    def _timed_out(self, ctx: Ctx, run: RunDict) -> None:
        """The stderr line the seed scheduler wrote for timed-out runs."""
        self.agent.note_stderr(self.run_dir(ctx, run["number"]), "job timed out")

    # -- after a run ---------------------------------------------------------------------
    def _release(self, ctx: Ctx) -> None:
        if ctx.status.pop("admission", None) is not None or ctx.phase in (
            Phase.STARTING,
            Phase.RUNNING,
            Phase.STOPPING,
        ):
            ctx.ops.append(lambda tx: sched.release(tx, ctx.uid))
            ctx.released(ctx.spec.pool, ctx.spec.slots)

    def finish(
        self,
        ctx: Ctx,
        run: RunDict,
        end: RunEnd,
        *,
        exit_code: int | None,
        signal: int | None = None,
        reason: str | None = None,
        message: str = "",
    ) -> Result:
        outcome = end.outcome
        self._close_run(ctx, run, outcome, exit_code, signal, reason)
        code = f" with exit code {exit_code}" if exit_code is not None else ""
        detail = f": {message}" if message else ""
        ctx.note("Exited", f"run {run['number']} ended {outcome}{code}{detail}", warning=outcome != "Succeeded")
        self._release(ctx)
        return self._decide(ctx, end, message)

    def _close_run(
        self, ctx: Ctx, run: RunDict, outcome: str, code: int | None, signal: int | None, reason: str | None
    ) -> None:
        self.agent.stop_trimming(self.run_dir(ctx, run["number"]))
        _close_run(ctx, run, outcome, code, signal, reason)

    def _decide(self, ctx: Ctx, end: RunEnd, message: str) -> Result:
        stop = self.stop_reason(ctx)
        decision = after_run(
            ctx.spec.retry,
            end,
            attempts=len(ctx.runs_this_revision()),
            cancelled=stop is not None and stop[0] in ("Cancelled", "Deleted"),
            deadline_passed=stop is not None and stop[0] == "DeadlineExceeded",
            rand=self.rand.random,
            service=ctx.spec.type == "service",
        )
        if not decision.retry:
            assert decision.outcome is not None  # a decision not to retry names the outcome
            return self.endings.complete(
                ctx, decision.outcome, decision.reason or decision.outcome, message or decision.message
            )
        ctx.status["nextRunAt"] = from_epoch(ctx.now + decision.delay)
        ctx.move(Phase.BACKOFF, RETRY_SCHEDULED, decision.message)
        self.endings.write(ctx)
        faults.point("during-backoff")
        return AGAIN if decision.delay <= 0 else requeue_after(decision.delay)


def _identity(run: RunDict) -> ProcessIdentity | None:
    if run.get("pid") is None:
        return None
    return ProcessIdentity(int(run["pid"]), float(run["processStartTime"]))


def _close_run(ctx: Ctx, run: RunDict, outcome: str, code: int | None, signal: int | None, reason: str | None) -> None:
    run["finishedAt"], run["outcome"], run["exitCode"] = ctx.now_text, outcome, code
    if signal:
        run["signal"] = signal
    if reason:
        run["reason"] = reason
