"""Steps of a run placed on a node served by a remote agent (`reconciler agent`): the
controller starts nothing there and sees no process; it reads what the agent reported on
the run's admission (start: pid and process start time; end: exit code and times, or the
process gone without a record), asks for stops by writing them into the job's status (the
agent follows its node's admissions), and judges the node's reachability by its heartbeat.

API.md section 2: an unreachable node's runs keep their slots, with the condition
NodeReachable=False, until their fate is proven (a report, the node deleted, `drain
--force`) or `retry.lostAfter` passes, counted from the node's last heartbeat."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..agent.local import ExitRecord, ProcessIdentity
from ..api import node as nodes
from ..api.meta import to_epoch
from ..api.quantity import format_size
from ..api.status import Phase, RunDict, RunOutcome, StopDict
from ..store import repository as repo
from ..store import scheduling as sched
from . import deadlines
from .context import Ctx
from .retry import RunEnd
from .runtime import AGAIN, Result, requeue_after
from .services import sooner
from .stops import Stop, drained
from .transitions import set_condition

if TYPE_CHECKING:
    from .runs import RunSteps

NODE_FRESH = 0.1  # a Node read by a step serves the steps of the next 100 ms (it moves with heartbeats)
UNREACHABLE_POLL = 5.0  # while a node is unreachable and no lostAfter is due sooner: look this often
SETTLE = 0.05  # judge a node's readiness just after its window ends, not just before


class Node:
    """What a step needs of a Node: is it served by a remote agent, is it Ready, when was
    its last heartbeat. Its silence counts from `since` at the earliest (when this controller
    started): heartbeats missed while no controller was up are not held against it (a server
    down for a minute must not find every node lost when it is back)."""

    def __init__(self, name: str, obj: repo.StoredObject | None, now: float, since: float = 0.0):
        self.name = name
        self.exists = obj is not None
        status: dict[str, Any] = (obj.status or {}) if obj is not None else {}
        self.remote = bool(status.get("remote"))
        self.withdraws = bool(status.get("withdraws"))  # its agent answers a stop of a run it has not started
        beat = status.get("heartbeatAt")
        self.heartbeat = to_epoch(beat) if beat else None
        self.counted = None if self.heartbeat is None else max(self.heartbeat, since)  # silent since
        self.ready = self.counted is not None and now - self.counted < nodes.READY_WINDOW

    def not_ready_at(self) -> float | None:
        return None if self.counted is None else self.counted + nodes.READY_WINDOW + SETTLE


class RemoteSteps:
    def __init__(self, runs: RunSteps):
        self.runs = runs
        self.store = runs.store
        self._nodes: dict[str, tuple[float, repo.StoredObject | None]] = {}  # name -> (monotonic read time, Node)
        self.since = 0.0  # when this controller started (Controller.start): nodes' silence counts from then

    def node(self, name: str | None, now: float) -> Node | None:
        """The node if a remote agent serves it (or served it: deleted, its runs are lost).
        The Node read by one step serves the steps of the next NODE_FRESH seconds: a burst of
        runs on a node costs one read of it, not three per run; its readiness is still judged
        against each step's clock (a heartbeat only makes a node fresher, and one is posted
        every few seconds, so a read 100 ms old tells the same)."""
        if name is None or name == self.runs.agent.node:
            return None
        kept = self._nodes.get(name)
        if kept is not None and time.monotonic() - kept[0] < NODE_FRESH:
            obj = kept[1]
        elif (noted := self.store.noted_node(name)) is not None:  # read in this batch (an agent's reports)
            obj = noted
            self._nodes[name] = (time.monotonic(), obj)
        else:
            with self.store.read() as session:
                obj = repo.get(session, kind="Node", name=name)
            self._nodes[name] = (time.monotonic(), obj)
        found = Node(name, obj, now, self.since)
        if obj is None:
            return found if self._was_remote(name) else None
        return found if found.remote else None

    def _was_remote(self, name: str) -> bool:
        """A deleted node: its runs are lost whoever served it, when no local agent did."""
        return name != self.runs.agent.node

    def _report(self, ctx: Ctx, number: int) -> dict[str, Any] | None:
        held = self.store.reported(ctx.uid)  # a report handed to this batch: nothing to read
        if held is None:
            with self.store.read() as session:
                held = sched.admission(session, ctx.uid)
        if held is None or held.run_number != number:
            return None
        return held.report

    # -- Starting --------------------------------------------------------------------------
    def starting(self, ctx: Ctx, held: sched.Admission, node: Node) -> Result:
        # `held` was read in this step, or made in this batch's open transaction, which no
        # agent can have seen: its report, if any, is the one there is
        report = held.report
        if report is not None and report.get("startFailed"):
            run = self.runs.new_run(ctx, held.run_number, None, node=node.name)
            reason, retryable = str(report.get("startReason") or "StartFailed"), bool(report.get("retryable"))
            end = RunEnd(RunOutcome.START_FAILED, reason=reason, retryable=retryable)
            message = str(report["startFailed"])
            if retryable and ctx.spec.type != "service":  # as a local artifact's failure says it
                message += f" (attempt {len(ctx.runs_this_revision())} of {ctx.spec.retry.limit + 1})"
            return self.runs.ends.finish(ctx, run, end, exit_code=None, reason=reason, message=message)
        if report is not None and report.get("startedAt"):
            identity = _identity(report)
            run = self.runs.new_run(ctx, held.run_number, identity, report["startedAt"], node=node.name)
            if report.get("limits"):
                run["limits"] = report["limits"]
            ctx.status.setdefault("startTime", run["startedAt"])
            if ctx.spec.readiness is not None:  # not ready until this run's first probe passes (on its node)
                ctx.status["ready"] = False
                set_condition(
                    ctx.status, "Ready", False, "ProbePending", "no readiness probe has passed yet", ctx.now_text
                )
            pid = f" (pid {identity.pid})" if identity else ""
            reason = "CrashLoop" if ctx.status.get("reason") == "CrashLoop" else "Started"
            ctx.move(Phase.RUNNING, reason, f"run {held.run_number} started on {node.name}{pid}", event="Started")
            if report.get("finishedAt"):
                # the agent reported the start and the end at once (a short run): both are
                # written in this step's one transaction, the Running step is not taken
                return self._ended(ctx, run, report)
            self.runs.endings.write(ctx)
            return AGAIN
        if (drain := drained(ctx, held.run_number, node.name)) is not None:
            return self.runs.unstarted(ctx, drain)  # the run does not start there; a late start is refused
        if (stop := self.runs.stop_reason(ctx)) is not None:
            # not known to have started, which is not known not to have: its agent may have
            # started it (its report delayed, the node partitioned). The slots wait for its
            # word (withdrawn), as a stop of a Running run's do. An older agent never gives
            # it (it skips such a stop): its slots go back now, as they always did
            if not node.withdraws:
                return self.runs.ends.after_stop(ctx, stop, run=None)
            return self._withdraw(ctx, held.run_number, stop)
        lost = self._lost(ctx, node, held.run_number)
        if lost is not None:
            return self.runs.unstarted(ctx, lost)
        self._reachability(ctx, node)
        return requeue_after(self._due(ctx, node, None))

    def _withdraw(self, ctx: Ctx, number: int, stop: Stop) -> Result:
        """Stopping with no run known: the agent sees the stop in its node's runs and either
        reports the run never started (and never starts it) or stops it as a Running one."""
        self._begin_stop(ctx, stop, unstarted=number)
        return AGAIN

    def withdrawn(self, ctx: Ctx, stop: StopDict) -> Result:
        """Stopping run `stop["unstarted"]` before it was known to start: the slots are
        released once its agent says it never started it, or its node is proven gone; a start
        reported meanwhile makes it a run, stopped as a Running one is."""
        why: Stop = (stop.get("reason", "Cancelled"), stop.get("message", ""))
        number = int(stop["unstarted"])
        with self.store.read() as session:
            held = sched.admission(session, ctx.uid)
        node = None if held is None or held.run_number != number else self.node(held.node, ctx.now)
        if held is None or node is None:
            return self.runs.ends.after_stop(ctx, why, run=None)  # nothing is held there any more
        report = held.report or {}
        if report.get("startedAt"):
            identity = _identity(report)
            run = self.runs.new_run(ctx, number, identity, report["startedAt"], node=node.name)
            if report.get("limits"):
                run["limits"] = report["limits"]
            stop.pop("unstarted")
            pid = f" (pid {identity.pid})" if identity else ""
            ctx.note("Started", f"run {number} started on {node.name}{pid} before its agent saw the stop")
            if report.get("finishedAt"):
                return self.stopping(ctx, run, node)
            self.runs.endings.write(ctx)
            return requeue_after(UNREACHABLE_POLL)
        if report.get("startFailed") or drained(ctx, number, node.name) is not None:
            return self.runs.ends.after_stop(ctx, why, run=None)  # it never ran (or is proven gone)
        if node.exists and not node.withdraws:  # an older agent serves it now: it will never say
            return self.runs.ends.after_stop(ctx, why, run=None)
        if self._lost(ctx, node, number) is not None:
            return self.runs.ends.after_stop(ctx, why, run=None)
        self._reachability(ctx, node)
        return requeue_after(self._due(ctx, node, None))

    # -- Running ---------------------------------------------------------------------------
    def running(self, ctx: Ctx, run: RunDict, node: Node) -> Result:
        report = self._report(ctx, run["number"]) or {}
        if report.get("finishedAt"):
            return self._ended(ctx, run, report)
        if (lost := self._lost(ctx, node)) is not None:
            return self.runs.ends.after_stop(ctx, lost, run=run)
        stop = self.runs.stop_reason(ctx)
        run_deadline = deadlines.run_deadline(ctx.spec, to_epoch(run["startedAt"]))
        if stop is None and deadlines.passed(run_deadline, ctx.now):
            stop = ("RunTimeout", f"run {run['number']} exceeded its runTimeout of {ctx.spec.run_timeout:g}s")
        if stop is not None:
            return self._begin_stop(ctx, stop)
        self._reachability(ctx, node)
        due = self._due(ctx, node, run_deadline)
        if ctx.spec.type == "service":  # readiness as the agent's probe found it; the end of a crash loop
            ready = report.get("ready")
            verdict = None if ready is None else (bool(ready), str(report.get("readyMessage") or ""))
            health = self.runs.services.health(ctx, run, verdict)
            due = sooner(due, health)
        return requeue_after(due)

    def _ended(self, ctx: Ctx, run: RunDict, report: dict[str, Any]) -> Result:
        self._heard(ctx, run.get("node"))
        _usage(run, report)
        finished = report["finishedAt"]
        if report.get("gone"):
            message = f"the agent of node {run.get('node')} found run {run['number']} gone without an exit record"
            end = RunEnd(RunOutcome.LOST, reason="NodeLost")
            return self.runs.ends.finish(
                ctx, run, end, exit_code=None, reason="NodeLost", message=message, finished_at=finished
            )
        code, signal = report.get("exitCode"), report.get("signal")
        if code != 0 and report.get("oomKills"):  # the cgroup's own count decides, as for a local run
            limit = format_size(ctx.spec.resources.memory or 0)
            message = f"the kernel killed {report['oomKills']} process(es) of the run at its memory limit ({limit})"
            end = RunEnd(RunOutcome.FAILED, code, reason="OOMKilled")
            return self.runs.ends.finish(
                ctx, run, end, exit_code=code, signal=signal, reason="OOMKilled", message=message, finished_at=finished
            )
        outcome = RunOutcome.SUCCEEDED if code == 0 else RunOutcome.FAILED
        return self.runs.ends.finish(
            ctx, run, RunEnd(outcome, code), exit_code=code, signal=signal, finished_at=finished
        )

    def _begin_stop(self, ctx: Ctx, stop: Stop, unstarted: int | None = None) -> Result:
        """The agent sees the job Stopping in its node's admissions and stops the process
        (SIGTERM, SIGKILL after the grace period, by its own clock), then reports the end.
        `unstarted`: the run number of a run not known to have started (`withdrawn`)."""
        reason, message = stop
        ctx.status["stop"] = {
            "reason": reason,
            "message": message,
            "requestedAt": ctx.now_text,
            "killAt": ctx.now + ctx.spec.stop_grace_period,
        }
        if unstarted is not None:
            ctx.status["stop"]["unstarted"] = unstarted
        ctx.move(Phase.STOPPING, reason, message, event="Stopping" if reason != "RunTimeout" else "RunTimeout")
        self.runs.endings.write(ctx)
        return requeue_after(UNREACHABLE_POLL)

    # -- Stopping --------------------------------------------------------------------------
    def stopping(self, ctx: Ctx, run: RunDict, node: Node) -> Result:
        stop = ctx.status.get("stop") or {}
        why: Stop = (stop.get("reason", "Cancelled"), stop.get("message", ""))
        report = self._report(ctx, run["number"]) or {}
        if report.get("finishedAt"):
            self._heard(ctx, node.name)
            _usage(run, report)
            if report.get("gone"):
                return self.runs.ends.after_stop(ctx, why, run=run, lost="its agent found the process gone")
            exited = ExitRecord(report.get("exitCode"), report.get("signal"))
            return self.runs.ends.after_stop(ctx, why, run=run, exited=exited, finished_at=report["finishedAt"])
        if (lost := self._lost(ctx, node)) is not None:
            # nobody can finish the stop, and it need not be: the run is Lost, and the job
            # goes where its stop leads (a stop of the run itself ends in NodeLost)
            stop_of: Stop = lost if why[0] in ("RunTimeout", "NodeLost") else why
            return self.runs.ends.after_stop(ctx, stop_of, run=run, lost=lost[1])
        self._reachability(ctx, node)
        return requeue_after(self._due(ctx, node, None))

    # -- the node's reachability -------------------------------------------------------------
    def _lost(self, ctx: Ctx, node: Node, admitted: int | None = None) -> Stop | None:
        """The run's fate proven without its agent: the node deleted, drained with --force
        while nobody serves it, or unreachable for the job's retry.lostAfter. `admitted`:
        the run number of the admission, when the caller holds it."""
        if not node.exists:
            return "NodeLost", f"node {node.name} was deleted"
        if not node.ready:
            run = ctx.open_run()
            held_number = run["number"] if run is not None else admitted
            if held_number is None:
                held_number = _admitted_run(self.store, ctx.uid)
            if held_number is not None and (drain := drained(ctx, held_number, node.name)) is not None:
                return drain
        lost_after = ctx.spec.retry.lost_after
        if node.ready or lost_after is None or node.heartbeat is None or node.counted is None:
            return None
        if ctx.now >= node.counted + lost_after:
            return "NodeLost", (
                f"node {node.name} posted no heartbeat for {ctx.now - node.heartbeat:.0f}s "
                f"(retry.lostAfter {lost_after:g}s): its run is declared lost"
            )
        return None

    def _reachability(self, ctx: Ctx, node: Node) -> None:
        """NodeReachable=False on a job whose run's node stopped posting heartbeats (True
        again when it is back); written only when it changes."""
        current = next((c for c in ctx.status.get("conditions", []) if c["type"] == "NodeReachable"), None)
        if node.ready:
            if current is not None and current["status"] == "False":
                set_condition(ctx.status, "NodeReachable", True, "NodeReady", f"node {node.name} is back", ctx.now_text)
                ctx.note("NodeReachable", f"node {node.name} posts heartbeats again")
                self.runs.endings.write(ctx)
            return
        if current is None or current["status"] != "False":
            message = (
                f"node {node.name} posted no heartbeat for {nodes.READY_WINDOW:g}s; its run keeps its slots "
                "until its fate is known"
            )
            set_condition(ctx.status, "NodeReachable", False, "NodeNotReady", message, ctx.now_text)
            ctx.note("NodeUnreachable", message, warning=True)
            self.runs.endings.write(ctx)

    @staticmethod
    def _heard(ctx: Ctx, node: str | None) -> None:
        """The node's agent reported the run's end: it is reachable, whatever its heartbeat
        says yet (written with the end)."""
        current = next((c for c in ctx.status.get("conditions", []) if c["type"] == "NodeReachable"), None)
        if current is not None and current["status"] == "False":
            message = f"the agent of node {node} reported again"
            set_condition(ctx.status, "NodeReachable", True, "AgentReported", message, ctx.now_text)

    def _due(self, ctx: Ctx, node: Node, run_deadline: float | None) -> float | None:
        """When to look again: a deadline, the node turning NotReady, or its lostAfter."""
        due = deadlines.soonest(ctx.now, run_deadline, ctx.job_deadline())
        if node.ready:
            check = node.not_ready_at()
            wait = None if check is None else max(check - ctx.now, SETTLE)
        else:
            wait = UNREACHABLE_POLL
            lost_after = ctx.spec.retry.lost_after
            if lost_after is not None and node.counted is not None:
                wait = min(wait, max(node.counted + lost_after - ctx.now, SETTLE))
        if wait is None:
            return due
        return wait if due is None else min(due, wait)


def _admitted_run(store: Any, uid: str) -> int | None:
    with store.read() as session:
        held = sched.admission(session, uid)
    return None if held is None else held.run_number


def _usage(run: RunDict, report: dict[str, Any]) -> None:
    """What the run's cgroup counted on its node, as `describe` shows it for local runs."""
    if report.get("peakMemory") is not None:
        run["peakMemory"] = int(report["peakMemory"])
    if report.get("cpuSeconds") is not None:
        run["cpuSeconds"] = float(report["cpuSeconds"])


def _identity(report: dict[str, Any]) -> ProcessIdentity | None:
    if report.get("pid") is None:
        return None
    return ProcessIdentity(int(report["pid"]), float(report.get("processStartTime") or 0.0))
