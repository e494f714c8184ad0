"""What follows a run: its stop (Stopping: SIGTERM, then SIGKILL after the grace period), the
record of its end, the release of its slots, and where the job goes next (retry, backoff,
completion, or where the stop leads). `RunEnds` works for `RunSteps` (runs.py), whose
Starting and Running steps and the remote and service steps hand it a run that is over or
must stop."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..agent.local import ExitRecord, ProcessIdentity, Usage
from ..api.meta import from_epoch, to_epoch
from ..api.quantity import format_size
from ..api.status import Phase, RunDict, RunOutcome
from ..store import scheduling as sched
from . import deadlines, faults
from .context import RETRY_SCHEDULED, Ctx
from .retry import RunEnd, after_run, restart_delay
from .runtime import AGAIN, Result, requeue_after
from .services import lifetimes
from .stops import Stop, drained

if TYPE_CHECKING:
    from .runs import RunSteps

STOP_POLL = 0.05  # while stopping, look this often (a stop lasts at most the grace period)
WRAPPER_GRACE = 2.0  # after SIGKILL, how long the wrapper gets to record before it is killed too
OTHER_AGENT_POLL = 5.0  # a run on another node: only its agent sees its processes

log = logging.getLogger(__name__)


class RunEnds:
    def __init__(self, runs: RunSteps):
        self.runs = runs
        self.agent, self.store, self.endings = runs.agent, runs.store, runs.endings
        self.services, self.rand = runs.services, runs.rand

    # -- a run that is over ---------------------------------------------------------------
    def ended(self, ctx: Ctx, run: RunDict, exited: ExitRecord | None) -> Result:
        faults.point("before-exit-record", self.store.flush)
        if (exited is None or exited.exit_code != 0) and (oom := self._oom_killed(ctx, run, exited)) is not None:
            return oom
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
            ctx,
            run,
            RunEnd(outcome, exited.exit_code),
            exit_code=exited.exit_code,
            signal=exited.signal,
            finished_at=_ended_at(exited),
        )

    def _oom_killed(self, ctx: Ctx, run: RunDict, exited: ExitRecord | None) -> Result | None:
        """A run that failed (or whose wrapper was killed before it could record) after the
        kernel killed a process of its cgroup at the memory limit ends Failed/OOMKilled. The
        cgroup's own count decides, not a guess from 137: a run killed by SIGKILL from
        elsewhere is no OOM, and a run whose command survived a killed child is no failure."""
        usage = self.agent.usage(run.get("cgroup"))
        if usage is None or not usage.oom_kills:
            return None
        limit = format_size(ctx.spec.resources.memory or 0)
        message = f"the kernel killed {usage.oom_kills} process(es) of the run at its memory limit ({limit})"
        code, sig = (exited.exit_code, exited.signal) if exited is not None else (None, None)
        end = RunEnd(RunOutcome.FAILED, code, reason="OOMKilled")
        at = _ended_at(exited) if exited is not None else None
        return self.finish(
            ctx, run, end, exit_code=code, signal=sig, reason="OOMKilled", message=message, finished_at=at
        )

    # -- Stopping ------------------------------------------------------------------------
    def begin_stop(self, ctx: Ctx, identity: ProcessIdentity, stop: Stop, cgroup: str | None) -> Result:
        reason, message = stop
        self.runs.leading()
        self.agent.terminate(identity, cgroup)
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

    def stopping(self, ctx: Ctx) -> Result:
        run, stop = ctx.open_run(), ctx.status.get("stop") or {}
        if run is None and stop.get("unstarted") is not None:  # a remote run not known to have started
            return self.runs.remote.withdrawn(ctx, stop)
        if run is not None and run.get("node") != self.agent.node:
            if (node := self.runs.remote.node(run.get("node"), ctx.now)) is not None:
                return self.runs.remote.stopping(ctx, run, node)
            lost = drained(ctx, run["number"], run.get("node"))
            if lost is not None and not self.runs.node_served(run.get("node"), ctx.now):
                # the stop cannot be finished by anyone, and need not be: the run is Lost, and
                # the job goes where its stop leads (a stop of the run itself ends in NodeLost)
                why = stop.get("reason", "Cancelled")
                stop_of: Stop = lost if why in ("RunTimeout", "Exited", "NodeLost") else (why, stop.get("message", ""))
                return self.after_stop(ctx, stop_of, run=run, lost=lost[1])
            return requeue_after(OTHER_AGENT_POLL)
        identity = run_identity(run) if run else None
        cgroup = run.get("cgroup") if run else None
        if run is not None and identity is not None and self.agent.alive(identity, cgroup):
            self.agent.trim_logs(self.runs.run_dir(ctx, run["number"]), ctx.spec.kept_log_bytes)
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
                self.agent.kill(identity, cgroup, wrapper_too=ctx.now >= kill_at + WRAPPER_GRACE)
            return requeue_after(STOP_POLL)
        reason = (stop.get("reason", "Cancelled"), stop.get("message", ""))
        if run is None:
            return self.after_stop(ctx, reason, run=None)
        exited = self.agent.exit_of(self.runs.run_dir(ctx, run["number"]))
        if reason[0] == "Exited":
            return self.ended(ctx, run, exited)
        return self.after_stop(ctx, reason, run=run, exited=exited)

    def after_stop(
        self,
        ctx: Ctx,
        stop: Stop,
        run: RunDict | None,
        exited: ExitRecord | None = None,
        *,
        lost: str | None = None,
        finished_at: str | None = None,
    ) -> Result:
        """The run (if any) is over and its processes are gone: record it, release the slots,
        then go where the stop reason leads. `lost` says why the run is recorded Lost
        (NodeLost) whatever stopped it: `drain --force` proved it gone where nobody could."""
        reason, message = stop
        if reason == "NodeLost":
            if run is None:
                return self.runs.unstarted(ctx, stop)
            lost = message
        if finished_at is None and run is not None and exited is not None:
            finished_at = _ended_at(exited)  # a stopped run too ended when its wrapper said
        if run is not None:
            if lost is not None:
                code, sig = (exited.exit_code, exited.signal) if exited else (None, None)
                self._close_run(ctx, run, RunOutcome.LOST, code, sig, "NodeLost", finished_at)
                ctx.note("Exited", f"run {run['number']} ended Lost: {lost}", warning=True)
            elif reason in ("RunTimeout", "DeadlineExceeded"):
                self._timed_out(ctx, run)
                self._close_run(ctx, run, RunOutcome.TIMED_OUT, -1, None, reason, finished_at)
            else:
                code = exited.exit_code if exited else None
                signal = exited.signal if exited else None
                self._close_run(ctx, run, RunOutcome.CANCELLED, code, signal, reason, finished_at)
        ctx.status.pop("stop", None)
        if reason != "Deleted" and ctx.obj.deleted_at is not None:
            # deleted while the run stopped for another reason: the deletion wins, now (no
            # later change would bring the job back to be removed)
            return self.endings.finalize_delete(ctx)
        if (
            reason == "RunTimeout"
            and run is not None
            and self.services.restarts_in_place(ctx, RunEnd(RunOutcome.TIMED_OUT))
        ):
            return self.services.restart_later(ctx, run)
        self.release(ctx)
        if reason == "RunTimeout":
            return self.decide(ctx, RunEnd(RunOutcome.TIMED_OUT, -1), message)
        if reason == "NodeLost":  # counts against retry.limit like any failed attempt; retried per onLost
            return self.decide(ctx, RunEnd(RunOutcome.LOST, reason="NodeLost"), message)
        if reason == "Deleted":
            return self.endings.finalize_delete(ctx)
        if reason == "Suspended":
            ctx.move(
                Phase.SUSPENDED, "Suspended", "suspended; the run was stopped and the job keeps its queue position"
            )
            self.endings.write(ctx)
            # a resume, a cancel or a new spec asked for while the run stopped was written
            # while Stopping, and no later change brings it back: the next look takes it up
            return AGAIN
        if reason == "SpecChanged":
            return self.endings.start_revision(ctx)
        outcome = "TimedOut" if reason == "DeadlineExceeded" else "Cancelled"
        self.endings.complete(ctx, outcome, reason, message)
        return AGAIN  # as a suspension's: a new spec given meanwhile starts its revision

    def _timed_out(self, ctx: Ctx, run: RunDict) -> None:
        """The stderr line the seed scheduler wrote for timed-out runs (a remote agent writes
        its own when it stops a run for RunTimeout)."""
        if run.get("node") != self.agent.node:
            return
        self.agent.note_stderr(self.runs.run_dir(ctx, run["number"]), "job timed out")

    # -- after a run ---------------------------------------------------------------------
    def release(self, ctx: Ctx) -> None:
        if ctx.status.pop("admission", None) is not None or ctx.phase in (
            Phase.STARTING,
            Phase.RUNNING,
            Phase.STOPPING,
        ):
            ctx.ops.append(lambda tx: sched.free(tx, ctx.uid))
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
        finished_at: str | None = None,
    ) -> Result:
        """`finished_at`: when the run ended (its exit record's time, or as its remote agent
        saw it); else now."""
        outcome = end.outcome
        self._close_run(ctx, run, outcome, exit_code, signal, reason, finished_at)
        code = f" with exit code {exit_code}" if exit_code is not None else ""
        detail = f": {message}" if message else ""
        ctx.note("Exited", f"run {run['number']} ended {outcome}{code}{detail}", warning=outcome != "Succeeded")
        if self.services.restarts_in_place(ctx, end):
            return self.services.restart_later(ctx, run)
        self.release(ctx)
        return self.decide(ctx, end, message)

    def _close_run(
        self,
        ctx: Ctx,
        run: RunDict,
        outcome: str,
        code: int | None,
        signal: int | None,
        reason: str | None,
        finished_at: str | None = None,
    ) -> None:
        if run.get("node") == self.agent.node:  # a remote run's files are its agent's
            run_dir = self.runs.run_dir(ctx, run["number"])
            self.agent.stop_trimming(run_dir)
            self.agent.discard_work(run_dir)  # an artifact's unpacked folder goes with the run
        if (cgroup := run.get("cgroup")) is not None and run.get("node") == self.agent.node:
            _record_usage(run, self.agent.usage(cgroup))
            if not self.agent.remove_cgroup(cgroup):  # cannot be: its processes were proven gone
                log.warning("the cgroup %s of job %s could not be removed", cgroup, ctx.name)
        _close_run(ctx, run, outcome, code, signal, reason)
        if finished_at is not None:
            # never before its start: a clock stepped back, or a remote agent back from a crash
            # that dates the start of a run that ended meanwhile at its return
            started = run.get("startedAt")
            run["finishedAt"] = started if started and to_epoch(started) > to_epoch(finished_at) else finished_at

    def decide(self, ctx: Ctx, end: RunEnd, message: str) -> Result:
        stop = self.runs.stop_reason(ctx)
        service = ctx.spec.type == "service"
        runs = ctx.runs_this_revision()
        decision = after_run(
            ctx.spec.retry,
            end,
            attempts=len(runs),
            number=runs[-1]["number"] if runs else None,
            cancelled=stop is not None and stop[0] in ("Cancelled", "Deleted"),
            deadline_passed=stop is not None and stop[0] == "DeadlineExceeded",
            rand=self.rand.random,
            restart=restart_delay(ctx.spec.restart_policy, lifetimes(ctx)).delay if service else None,
        )
        if not decision.retry:
            assert decision.outcome is not None  # a decision not to retry names the outcome
            return self.endings.complete(
                ctx, decision.outcome, decision.reason or decision.outcome, message or decision.message
            )
        ctx.status["nextRunAt"] = from_epoch(ctx.now + decision.delay)
        ctx.move(Phase.BACKOFF, RETRY_SCHEDULED, decision.message)
        self.endings.write(ctx)
        faults.point("during-backoff", self.store.flush)
        if decision.delay <= 0:
            return AGAIN
        # the job's own timeout may come first: it ends the job in Backoff, not at the retry
        return requeue_after(deadlines.soonest(ctx.now, ctx.now + decision.delay, ctx.job_deadline()))


def _ended_at(exited: ExitRecord) -> str | None:
    """When the run ended by its exit record (its wrapper wrote it then), not when the
    controller saw it: a run that ended while no controller ran keeps its true end."""
    return None if exited.at is None else from_epoch(exited.at)


def run_identity(run: RunDict) -> ProcessIdentity | None:
    """The run's wrapper as its record names it (none before it started)."""
    if run.get("pid") is None:
        return None
    return ProcessIdentity(int(run["pid"]), float(run["processStartTime"]))


def _record_usage(run: RunDict, usage: Usage | None) -> None:
    """What `describe` shows of a run: the most memory it held at once, its CPU time."""
    if usage is None:
        return
    if usage.peak_memory is not None:
        run["peakMemory"] = usage.peak_memory
    if usage.cpu_seconds is not None:
        run["cpuSeconds"] = round(usage.cpu_seconds, 3)


def _close_run(ctx: Ctx, run: RunDict, outcome: str, code: int | None, signal: int | None, reason: str | None) -> None:
    run["finishedAt"], run["outcome"], run["exitCode"] = ctx.now_text, outcome, code
    if signal:
        run["signal"] = signal
    if reason:
        run["reason"] = reason
