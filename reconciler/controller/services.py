"""Steps of a service job (API.md `type: service`) between and around its runs: a run that
ended by itself is restarted in place on its node, keeping its admission, after the restart
delay (CrashLoop while runs live shorter than resetAfter); a live run is probed for readiness,
and recovers from CrashLoop once it has lived resetAfter. What every run shares (start, stop,
an end's record) is runs.py's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..api.annotations import LOST_RUN
from ..api.meta import from_epoch, to_epoch
from ..api.quantity import format_left
from ..api.status import Phase, RunDict, RunOutcome
from ..store import scheduling as sched
from . import deadlines
from .context import Ctx
from .retry import RunEnd, restart_delay
from .runtime import AGAIN, Result, requeue_after
from .stops import drained
from .transitions import set_condition

if TYPE_CHECKING:
    from .runs import RunSteps

KEPT_SERVICE_RUNS = 20  # a service restarts without end: its oldest run records go (status.restarts counts them all)

Verdict = tuple[bool, str]  # a readiness probe's: (ready, why)


class ServiceSteps:
    def __init__(self, runs: RunSteps):
        self.runs = runs

    def restarts_in_place(self, ctx: Ctx, end: RunEnd) -> bool:
        """A service whose run ended by itself restarts on its node, keeping its admission
        (its port too), as does one whose artifact could not be fetched (retryable: the
        next run fetches it again); a start that failed otherwise, or a stop asked for, goes
        the way any run's end goes."""
        started = end.outcome != RunOutcome.START_FAILED or end.retryable
        return ctx.spec.type == "service" and started and self.runs.stop_reason(ctx) is None

    def restart_later(self, ctx: Ctx, run: RunDict) -> Result:
        """Phase stays Running (reason CrashLoop after a run shorter than resetAfter) with no
        run alive until nextRunAt; `restart_due` starts the next run with the same slots."""
        self.runs.probes.forget(ctx.name)
        ctx.status.pop("ready", None)
        if ctx.spec.readiness is not None:  # nothing to reach until the next run's probe passes
            set_condition(ctx.status, "Ready", False, "NotRunning", "between runs: the service restarts", ctx.now_text)
        restart = restart_delay(ctx.spec.restart_policy, lifetimes(ctx))
        ctx.status["nextRunAt"] = from_epoch(ctx.now + restart.delay)
        ctx.status["restarts"] = ctx.status.get("restarts", 0) + 1
        runs = ctx.status["runs"]
        dropped = runs[: max(0, len(runs) - KEPT_SERVICE_RUNS)]
        del runs[: len(dropped)]
        ended = f"run {run['number']} ended; restarting in {format_left(restart.delay)}"
        if restart.crash_loop:
            reset = ctx.spec.restart_policy.reset_after
            why = f"{restart.streak} run(s) in a row lived shorter than resetAfter ({reset:g}s)"
            ctx.move(Phase.RUNNING, "CrashLoop", f"{ended}: {why}", event="BackOff")
        else:
            ctx.move(Phase.RUNNING, "Restarting", ended, event="RestartScheduled")
        self.runs.endings.write(ctx)
        here = [r["number"] for r in dropped if r.get("node") in (None, self.runs.agent.node)]
        if here:  # their records went with this write: their folders go once it is committed
            agent = self.runs.agent
            self.runs.store.on_commit(lambda: agent.remove_runs(ctx.name, ctx.uid, here))
        return requeue_after(deadlines.soonest(ctx.now, ctx.now + restart.delay, ctx.job_deadline()))

    def restart_due(self, ctx: Ctx) -> Result:
        """A service between runs: stopped for good if asked, else its next run is admitted
        in place (the admission's run number moves on) once nextRunAt has come."""
        runs = self.runs
        if (stop := runs.stop_reason(ctx)) is not None:
            return runs.ends.after_stop(ctx, stop, run=None)
        held = runs.endings.admitted.pop(ctx.uid, None)
        if held is None:
            with runs.store.read() as session:
                held = sched.admission(session, ctx.uid)
        if held is None:
            raise RuntimeError(f"service {ctx.name} waits to restart without an admission")
        if (lost := drained(ctx, held.run_number, held.node)) is not None:
            # nothing runs there to stop: the slots go back, and the service goes back in line
            # (through Backoff, due now) to be placed again, maybe elsewhere
            runs.ends.release(ctx)
            ctx.annotations = {k: v for k, v in ctx.obj.annotations.items() if k != LOST_RUN}
            ctx.status["nextRunAt"] = ctx.now_text
            ctx.move(Phase.BACKOFF, "NodeDrained", f"{lost[1]}; the service was between runs: placed again")
            runs.endings.write(ctx)
            return AGAIN
        at = to_epoch(ctx.status.get("nextRunAt") or ctx.now_text)
        if at > ctx.now:
            return requeue_after(deadlines.soonest(ctx.now, at, ctx.job_deadline()))
        number = held.run_number + 1
        ctx.status.pop("nextRunAt", None)
        owner = runs.owner if held.node == runs.agent.node else None  # a remote agent is told by the new epoch
        ctx.ops.append(lambda tx: sched.restart_run(tx, ctx.uid, number, owner))
        reason = "CrashLoop" if ctx.status.get("reason") == "CrashLoop" else "Restarting"
        ctx.move(Phase.STARTING, reason, f"run {number}: restarting the service on {held.node}", event="Restarting")
        runs.endings.write(ctx)
        runs.endings.admitted[ctx.uid] = sched.Admission(held.node, number, owner)
        return AGAIN

    def health(self, ctx: Ctx, run: RunDict, verdict: Verdict | None = None) -> float | None:
        """Readiness from the last probe, and the end of CrashLoop once the run has lived
        resetAfter; written only when either changes. The delay until it is looked at again.
        `verdict`: the probe's, as a remote agent reported it (its probe runs there)."""
        due: float | None = None
        if ctx.status.get("reason") == "CrashLoop":
            healthy_at = to_epoch(run["startedAt"]) + ctx.spec.restart_policy.reset_after
            if ctx.now >= healthy_at:
                message = f"run {run['number']} has lived resetAfter; the restart delay is reset"
                ctx.move(Phase.RUNNING, "Recovered", message)
            else:
                due = healthy_at - ctx.now
        readiness = ctx.spec.readiness
        if readiness is not None:
            if run.get("node") == self.runs.agent.node:
                verdict = self.runs.probes.verdict(
                    ctx.name, ctx.uid, readiness.as_wait_probe(), ctx.spec.host_dir, ctx.spec.env
                )
                due = sooner(due, readiness.interval * (0.9 + 0.2 * self.runs.rand.random()))
            # a change of verdict is written; so is the first failure of a run's probe, which
            # leaves ready False as it was but says why the service is not ready yet
            if verdict is not None and (verdict[0] != ctx.status.get("ready") or _first_failure(ctx, verdict)):
                ctx.status["ready"] = verdict[0]
                reason = "ProbeSucceeded" if verdict[0] else "ProbeFailed"
                set_condition(ctx.status, "Ready", verdict[0], reason, verdict[1], ctx.now_text)
                ctx.note("Ready" if verdict[0] else "NotReady", verdict[1], warning=not verdict[0])
        if ctx.changed() or ctx.events:
            self.runs.endings.write(ctx)
        return due


def _first_failure(ctx: Ctx, verdict: Verdict) -> bool:
    """A failed probe while the Ready condition still says no probe has run (ProbePending)."""
    ready = next((c for c in ctx.status.get("conditions", []) if c.get("type") == "Ready"), None)
    return not verdict[0] and ready is not None and ready.get("reason") == "ProbePending"


def lifetimes(ctx: Ctx) -> list[float]:
    """How long each ended run of this revision lived, oldest first."""
    return [
        to_epoch(r["finishedAt"]) - to_epoch(r["startedAt"])
        for r in ctx.runs_this_revision()
        if r.get("finishedAt") and r.get("startedAt")
    ]


def sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)
