"""Steps of a job whose process may be alive: Starting (spawn or adopt), Running (watch,
time out), Stopping (SIGTERM, then SIGKILL after the grace period), and what follows a run.

Process facts come from the agent: the wrapper's exit record, the process identity (pid +
start time). A job never completes while a process of its run is known alive."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from ..agent.identity import ProcessIdentity, is_alive
from ..agent.process import StartFailed
from ..api.meta import from_epoch, to_epoch
from ..store import scheduling as sched
from . import deadlines, faults
from .context import AGAIN, Ctx
from .retry import RunEnd, after_run

if TYPE_CHECKING:
    from .job import JobReconciler

STOP_POLL = 0.05  # while stopping, look this often (a stop lasts at most the grace period)
WRAPPER_GRACE = 2.0  # after SIGKILL, how long the wrapper gets to record before it is killed too
OTHER_AGENT_POLL = 5.0


def controller_identity() -> str:
    """host:pid:start — an owner that can be proven gone on this host."""
    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{me.create_time()}"


def owner_gone(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname():
        return False  # cannot be proven from here
    try:
        return not is_alive(ProcessIdentity(int(pid), float(start)))
    except ValueError:
        return False


class RunSteps:
    def __init__(self, jobs: JobReconciler):
        self.jobs = jobs
        self.agent = jobs.agent
        self.store = jobs.store

    def step(self, ctx: Ctx) -> float | None:
        return {"Starting": self.starting, "Running": self.running, "Stopping": self.stopping}[ctx.phase](ctx)

    def stop_reason(self, ctx: Ctx) -> tuple[str, str] | None:
        """Why a live run must stop now, in order of precedence."""
        if ctx.obj.deleted_at is not None:
            return "Deleted", "the job is being deleted"
        if ctx.cancel_requested():
            return "Cancelled", "cancelled by request"
        if deadlines.passed(self.jobs.job_deadline(ctx), ctx.now):
            return "DeadlineExceeded", f"the job exceeded its timeout of {ctx.spec.timeout:g}s"
        if ctx.spec.suspend:
            return "Suspended", "suspended"
        if ctx.spec_changed():
            return "SpecChanged", "the spec changed (apply --force)"
        return None

    def run_dir(self, ctx: Ctx, number: int) -> Path:
        return self.agent.run_dir(ctx.name, ctx.uid, number)

    # -- Starting ------------------------------------------------------------------------
    def starting(self, ctx: Ctx) -> float | None:
        held = self.jobs.admitted.pop(ctx.uid, None)
        if held is None:
            with self.store.read() as session:
                held = sched.admission(session, ctx.uid)
        if held is None:  # cannot happen through the transition table; recover by queueing again
            ctx.move("Queued", "AdmissionLost", "no admission found for a starting job; queued again")
            self.jobs._enqueue(ctx)
            self.jobs.write(ctx, None)
            return AGAIN
        if held.node != self.agent.node:
            return OTHER_AGENT_POLL  # another node's agent starts it
        if not self._claim(ctx, held):
            # another live controller owns this spawn: it starts the run (or already has, and
            # records it); adopting that process from here would race it for the record
            return OTHER_AGENT_POLL
        number, run_dir = held.run_number, self.run_dir(ctx, held.run_number)
        identity = self.agent.find(run_dir)
        exited = self.agent.exit_of(run_dir)
        started_at = None  # now, unless an adopted process tells when it really started
        if identity is None and exited is None:
            if (stop := self.stop_reason(ctx)) is not None:
                return self.after_stop(ctx, stop[0], stop[1], run=None)
            faults.point("after-admission")
            try:
                identity = self.agent.start(ctx.name, ctx.uid, number, ctx.spec, ctx.revision)
                faults.point("after-spawn")
            except StartFailed as exc:
                run = self._new_run(ctx, number, None)
                return self.finish(
                    ctx, run, RunEnd("StartFailed"), exit_code=None, reason="StartFailed", message=str(exc)
                )
        elif identity is not None:  # spawned before a crash: adopt it, with its real start (runTimeout counts from it)
            self.agent.watch(ctx.name, identity)
            started_at = from_epoch(min(self.agent.started_at(identity), ctx.now))
        run = self._new_run(ctx, number, identity, started_at)
        ctx.status.setdefault("startTime", run["startedAt"])
        ctx.move(
            "Running",
            "Started",
            f"run {number} started on {held.node}" + (f" (pid {identity.pid})" if identity else ""),
        )
        self.jobs.write(ctx, None)
        if identity is not None and started_at is None:
            # just spawned here and watched: the exit watcher wakes the job when it ends, so
            # only the deadlines need a timer (a Running step now would find it alive)
            return deadlines.soonest(
                ctx.now, deadlines.run_deadline(ctx.spec, to_epoch(run["startedAt"])), self.jobs.job_deadline(ctx)
            )
        return AGAIN

    def _claim(self, ctx: Ctx, held) -> bool:
        """Only one agent may start (or adopt) a given admission's run, even with two
        controllers: the unclaimed spawn, or that of an owner proven gone (a crash)."""
        if held.owner == self.jobs.owner:
            return True  # claimed at admission
        if held.owner is not None and not owner_gone(held.owner):
            return False
        with self.store.write() as tx:
            return sched.claim_spawn(tx, ctx.uid, self.jobs.owner, take_over_from=held.owner)

    def _new_run(self, ctx: Ctx, number: int, identity: ProcessIdentity | None, started_at: str | None = None) -> dict:
        run = {
            "number": number,
            "revision": ctx.revision,
            "node": self.agent.node,
            "startedAt": started_at or ctx.now_text,
        }
        if identity is not None:
            run.update(pid=identity.pid, processStartTime=identity.start_time)
        ctx.status.setdefault("runs", []).append(run)
        return run

    # -- Running -------------------------------------------------------------------------
    def running(self, ctx: Ctx) -> float | None:
        run = ctx.open_run()
        if run is None:
            raise RuntimeError(f"job {ctx.name} is Running without an open run")
        if run.get("node") != self.agent.node:
            return OTHER_AGENT_POLL  # only the run's own agent can see its processes
        identity, run_dir = self._identity(run), self.run_dir(ctx, run["number"])
        alive = identity is not None and self.agent.alive(identity)
        exited = self.agent.exit_of(run_dir)
        if not alive:
            return self._ended(ctx, run, exited)
        self.agent.watch(ctx.name, identity)
        if exited is not None and not self.agent.leftovers(identity):
            return STOP_POLL  # the wrapper is writing its record and about to exit; the watcher wakes us
        if exited is not None:  # the command exited but left processes in its group
            return self._begin_stop(ctx, identity, "Exited", "the command exited; stopping what it left running")
        stop = self.stop_reason(ctx)
        run_deadline = deadlines.run_deadline(ctx.spec, to_epoch(run["startedAt"]))
        if stop is None and deadlines.passed(run_deadline, ctx.now):
            stop = ("RunTimeout", f"run {run['number']} exceeded its runTimeout of {ctx.spec.run_timeout:g}s")
        if stop is not None:
            return self._begin_stop(ctx, identity, *stop)
        return deadlines.soonest(ctx.now, run_deadline, self.jobs.job_deadline(ctx))

    def _identity(self, run: dict) -> ProcessIdentity | None:
        if run.get("pid") is None:
            return None
        return ProcessIdentity(int(run["pid"]), float(run["processStartTime"]))

    def _ended(self, ctx: Ctx, run: dict, exited) -> float | None:
        faults.point("before-exit-record")
        if exited is None:
            return self.finish(
                ctx,
                run,
                RunEnd("Lost"),
                exit_code=None,
                reason="ProcessLost",
                message=f"run {run['number']} ended without recording an exit status",
            )
        end = RunEnd("Succeeded" if exited.exit_code == 0 else "Failed", exited.exit_code)
        return self.finish(ctx, run, end, exit_code=exited.exit_code, signal=exited.signal)

    def _begin_stop(self, ctx: Ctx, identity: ProcessIdentity, reason: str, message: str) -> float:
        self.agent.terminate(identity)
        ctx.status["stop"] = {
            "reason": reason,
            "message": message,
            "requestedAt": ctx.now_text,
            "killAt": ctx.now + ctx.spec.stop_grace_period,
        }
        ctx.move(
            "Stopping",
            reason if reason != "Exited" else "Cleanup",
            message,
            event="Stopping" if reason != "RunTimeout" else "RunTimeout",
        )
        self.jobs.write(ctx, None)
        return STOP_POLL

    # -- Stopping ------------------------------------------------------------------------
    def stopping(self, ctx: Ctx) -> float | None:
        run, stop = ctx.open_run(), ctx.status.get("stop") or {}
        if run is not None and run.get("node") != self.agent.node:
            return OTHER_AGENT_POLL
        identity = self._identity(run) if run else None
        if identity is not None and self.agent.alive(identity):
            kill_at = float(stop.get("killAt", ctx.now))
            if ctx.now >= kill_at:
                if not stop.get("killed"):
                    stop["killed"] = True
                    ctx.note(
                        "Killing",
                        f"grace period over; SIGKILL to the process group of run {run['number']}",
                        warning=True,
                    )
                    self.jobs.write(ctx, None)
                self.agent.kill(identity, wrapper_too=ctx.now >= kill_at + WRAPPER_GRACE)
            return STOP_POLL
        reason, message = stop.get("reason", "Cancelled"), stop.get("message", "")
        if run is None:
            return self.after_stop(ctx, reason, message, run=None)
        exited = self.agent.exit_of(self.run_dir(ctx, run["number"]))
        if reason == "Exited":
            return self._ended(ctx, run, exited)
        return self.after_stop(ctx, reason, message, run=run, exited=exited)

    def after_stop(self, ctx: Ctx, reason: str, message: str, run: dict | None, exited=None) -> float | None:
        """The run (if any) is over and its processes are gone: record it, release the slots,
        then go where the stop reason leads."""
        code = exited.exit_code if exited else None
        if run is not None:
            if reason in ("RunTimeout", "DeadlineExceeded"):
                self._timed_out(ctx, run)
                self._close_run(ctx, run, "TimedOut", -1, None, reason)
            else:
                self._close_run(ctx, run, "Cancelled", code, exited.signal if exited else None, reason)
        self._release(ctx)
        ctx.status.pop("stop", None)
        if reason == "RunTimeout":
            return self._decide(ctx, RunEnd("TimedOut", -1), message)
        if reason == "Deleted":
            return self.jobs.finalize_delete(ctx)
        if reason == "Suspended":
            ctx.move("Suspended", "Suspended", "suspended; the run was stopped and the job keeps its queue position")
            self.jobs.write(ctx, None)
            return None
        if reason == "SpecChanged":
            return self.jobs.start_revision(ctx)
        outcome = "TimedOut" if reason == "DeadlineExceeded" else "Cancelled"
        return self.jobs.complete(ctx, outcome, reason, message)

    def _timed_out(self, ctx: Ctx, run: dict) -> None:
        """The stderr line the seed scheduler wrote for timed-out runs."""
        try:
            with open(self.run_dir(ctx, run["number"]) / "stderr", "a") as err:
                err.write("job timed out\n")
        except OSError:
            pass

    # -- after a run ---------------------------------------------------------------------
    def _close_run(self, ctx: Ctx, run: dict, outcome: str, code, signal, reason: str | None) -> None:
        run.update(finishedAt=ctx.now_text, outcome=outcome, exitCode=code)
        if signal:
            run["signal"] = signal
        if reason:
            run["reason"] = reason

    def _release(self, ctx: Ctx) -> None:
        if ctx.status.pop("admission", None) is not None or ctx.phase in ("Starting", "Running", "Stopping"):
            ctx.ops.append(lambda tx: sched.release(tx, ctx.uid))
            ctx.released(ctx.spec.pool, ctx.spec.slots)

    def finish(
        self, ctx: Ctx, run: dict, end: RunEnd, *, exit_code, signal=None, reason=None, message=""
    ) -> float | None:
        outcome = end.outcome
        self._close_run(ctx, run, outcome, exit_code, signal, reason)
        ctx.note(
            "Exited",
            f"run {run['number']} ended {outcome}"
            + (f" with exit code {exit_code}" if exit_code is not None else "")
            + (f": {message}" if message else ""),
            warning=outcome != "Succeeded",
        )
        self._release(ctx)
        return self._decide(ctx, end, message)

    def _decide(self, ctx: Ctx, end: RunEnd, message: str) -> float | None:
        stop = self.stop_reason(ctx)
        decision = after_run(
            ctx.spec.retry,
            end,
            attempts=len(ctx.runs_this_revision()),
            cancelled=stop is not None and stop[0] in ("Cancelled", "Deleted"),
            deadline_passed=stop is not None and stop[0] == "DeadlineExceeded",
            rand=self.jobs.rand.random,
            service=ctx.spec.type == "service",
        )
        if not decision.retry:
            return self.jobs.complete(
                ctx, decision.outcome, decision.reason or decision.outcome, message or decision.message
            )
        ctx.status["nextRunAt"] = from_epoch(ctx.now + decision.delay)
        ctx.move("Backoff", "BackoffScheduled", decision.message)
        self.jobs.write(ctx, None)
        faults.point("during-backoff")
        return AGAIN if decision.delay <= 0 else decision.delay
