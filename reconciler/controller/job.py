"""The job reconciler: observe -> decide -> act -> write status once, per step.

`JobReconciler(name)` reads one job, takes the step its phase calls for, and either goes on
to the next step at once (a step's `Result.again`) or returns when it wants to be called
again. The Queued step (admission and placement) is in queued.py; steps that concern a live
process (Starting, Running, Stopping) are in runs.py and runends.py; the writes that end a
job's revision (completion, deletion, a new revision) in endings.py."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..agent.local import LocalAgent
from ..agent.probe import Probes
from ..agent.probeprocs import ProbeProcs
from ..api import revisions
from ..api.job import JobSpec, WaitCondition
from ..api.meta import from_epoch, to_epoch
from ..api.status import SUSPENDED_MESSAGE, SUSPENDED_REASON, Phase, phase_of, waiting_for
from ..clock import Clock
from ..errors import Conflict
from ..store import Store, StoredObject, queuing
from ..store import repository as repo
from . import deadlines, dependencies, specs, waits
from .context import Ctx
from .endings import Endings
from .known import Known
from .pathwatch import PathWatch
from .queued import SAFETY_POLL, QueuedSteps
from .runs import RunSteps
from .runtime import AGAIN, DONE, Result, requeue_after

PATH_SAFETY_POLL = 600.0  # the same for a job whose paths the path watcher checks for it
WAIT_STATUS_REFRESH = 30.0  # unchanged wait results are written back at most this often
MAX_STEPS = 12

DepStates = dict[str, revisions.DepState | None]


class JobReconciler:
    def __init__(
        self,
        store: Store,
        agent: LocalAgent,
        *,
        clock: Clock,
        wake: Callable[..., None],
        owner: str,
        rand: random.Random | None = None,
        notified: Callable[[], None] | None = None,
    ):
        self.store = store
        self.notified = notified  # told after a step that wrote notifier events (the deliverer's wake-up)
        self.agent = agent
        self.clock = clock
        self.rand = rand or random.Random()
        self.wake = wake
        self.owner = owner
        self.paths = PathWatch(wake, clock)
        self.probes = Probes(wake, procs=ProbeProcs(agent.state_dir / "probes"))
        self.endings = Endings(
            store, paths=self.paths, probes=self.probes, wake=wake, remove_runs=agent.remove_job_runs
        )
        self._waiting_on: dict[str, list[str]] = {}  # job -> its dependencies, while last seen waiting for them
        self._priority: dict[str, int] = {}  # job -> spec.priority, as last seen (by_priority)
        self._uids: dict[str, str] = {}  # job -> its uid, as last seen: a deleted job's folders are found by it
        self.known = Known()  # jobs as this thread last read or wrote them, while no other writer commits
        self.runs = RunSteps(
            store, agent, self.endings, self.probes, owner=owner, rand=self.rand, clock=clock, wake=wake
        )
        self.admit = QueuedSteps(store, agent, self.endings, wake=wake, owner=owner, rand=self.rand)

    def forget(self) -> None:
        """A batch's writes were lost (its commit failed): drop what was remembered of them."""
        self.endings.forget()
        self.known.clear()

    @property
    def dependents(self) -> defaultdict[str, set[str]]:
        """job -> the jobs that depend on it, as far as this process has seen."""
        return self.endings.dependents

    # -- the entry point -------------------------------------------------------------
    def __call__(self, name: str) -> Result:
        try:
            return self._reconcile(name)
        except BaseException:
            self.known.drop(name)  # a step that failed may have written it
            raise

    def _reconcile(self, name: str) -> Result:
        obj: StoredObject | None = None
        seen_in: object | None = None
        for _ in range(MAX_STEPS):
            deps: DepStates | None = None
            spec: JobSpec | None
            kept = False
            if obj is None and (obj := self.known.get(name, epoch := self.store.epoch())) is not None:
                seen_in, spec, kept = epoch, self.spec_of(obj), True
            elif obj is None:
                with self.store.read() as session:
                    # a job last seen waiting for dependencies is most likely woken by one of
                    # them: their states are asked for with the job (one round trip on
                    # PostgreSQL), and used if its dependencies are still those
                    guess = self._waiting_on.get(name)
                    if guess is None:
                        obj, found = repo.get(session, kind="Job", name=name), None
                    else:
                        obj, found = repo.get_with_statuses(session, kind="Job", name=name, names=guess)
                    spec = self.spec_of(obj) if obj is not None else None
                    if obj is not None and spec is not None and phase_of(obj.status) == Phase.WAITING:
                        # what the Waiting step reads next, in the same snapshot
                        names = [d.job for d in spec.depends_on]
                        if found is not None and names == guess:
                            deps = _dep_states(found, names)
                        else:
                            deps = _read_dep_states(session, names)
                seen_in = self.store.epoch()
                if obj is None or spec is None:
                    if obj is None and (uid := self._uids.pop(name, None)) is not None:
                        self.agent.remove_job_runs(name, uid)  # deleted: its runs' folders go too
                    self._waiting_on.pop(name, None)
                    self._priority.pop(name, None)
                    self.endings.stop_watching(name)
                    self.endings.wake_dependents(name)
                    return DONE
            else:
                spec = self.spec_of(obj)
            self._uids[name] = obj.uid
            ctx = Ctx(obj, spec, self.clock.now(), dep_states=deps, seen_in=seen_in)
            if kept and ctx.phase == Phase.WAITING:  # what the Waiting step reads next, if kept too
                ctx.dep_states = self.known.dep_states([d.job for d in spec.depends_on], seen_in)
            try:
                result = self.step(ctx)
            except Conflict:
                self.known.drop(name)
                obj = None
                continue  # someone wrote the job meanwhile: observe again
            if ctx.seen_in is not None and ctx.seen_in is self.store.epoch(open=False):
                self.known.put(ctx.obj, ctx.seen_in)
            else:
                self.known.drop(name)
            if ctx.phase == Phase.WAITING and spec.depends_on:
                self._waiting_on[name] = [d.job for d in spec.depends_on]
            else:
                self._waiting_on.pop(name, None)
            self.after_commit(ctx)
            if not result.again:
                return result
            # the step's own write is the latest state, unless it went elsewhere
            obj, seen_in = (ctx.obj, ctx.seen_in) if ctx.written else (None, None)
        return AGAIN

    def by_priority(self, names: list[str]) -> list[str]:
        """The jobs of a batch in the order they compete for admission: higher priority first,
        else as taken. Of jobs made eligible together (one apply, a controller's start), the
        most urgent is then admitted first (API.md 2: priority, then eligibleAt, then uid),
        not the one that happened to be looked at first. Priorities are those last seen; a job
        never seen is read (one statement for them all), and in a batch kept for its steps."""
        unseen = [n for n in names if n not in self._priority]
        if unseen:
            with self.store.read() as session:
                found = repo.list_objects(session, kind="Job", names=unseen)
            epoch = self.store.epoch(open=False)
            for obj in found:
                self._priority[obj.name] = specs.spec_of(obj.name, obj.spec_text).priority
                self.known.put(obj, epoch)
        priority = self._priority
        if len({priority.get(n, 0) for n in names}) == 1:
            return names
        return sorted(names, key=lambda n: -priority.get(n, 0))

    def spec_of(self, obj: StoredObject) -> JobSpec:
        spec = specs.spec_of(obj.name, obj.spec_text)
        self._priority[obj.name] = spec.priority
        for dep in spec.depends_on:
            self.dependents[dep.job].add(obj.name)
        return spec

    def step(self, ctx: Ctx) -> Result:
        if ctx.phase in (Phase.STARTING, Phase.RUNNING, Phase.STOPPING):
            return self.runs.step(ctx)
        if ctx.obj.deleted_at is not None:
            return self.endings.finalize_delete(ctx)
        if self.revision_due(ctx):
            return self.endings.start_revision(ctx)
        if ctx.phase == Phase.COMPLETED:
            if self.endings.seen_own_completion(ctx.name):  # its own completion already woke who waits on it
                return DONE
            # completed elsewhere (another controller): wake its dependents and whoever may
            # use the slots it freed
            self.endings.wake_dependents(ctx.name)
            ctx.released(ctx.spec.pool, ctx.spec.slots)
            return DONE
        if ctx.cancel_requested():
            return self.endings.complete(ctx, "Cancelled", "Cancelled", ctx.cancel_message())
        if deadlines.passed(ctx.job_deadline(), ctx.now):
            message = f"the job exceeded its timeout of {ctx.spec.timeout:g}s"
            return self.endings.complete(ctx, "TimedOut", "DeadlineExceeded", message)
        if ctx.spec.suspend:
            if ctx.phase == Phase.SUSPENDED:
                return DONE
            self.probes.forget(ctx.name)
            if ctx.phase == Phase.QUEUED:  # only a job stored Queued holds a place in line
                ctx.ops.append(lambda tx: queuing.dequeue(tx, ctx.uid))
            ctx.move(Phase.SUSPENDED, SUSPENDED_REASON, SUSPENDED_MESSAGE)
            self.endings.write(ctx)
            return DONE
        if ctx.phase == Phase.SUSPENDED:
            return self.resume(ctx)
        if ctx.phase == Phase.WAITING:
            return self.waiting(ctx)
        if ctx.phase == Phase.QUEUED:
            return self.admit.queued(ctx)
        return self.backoff(ctx)

    def after_commit(self, ctx: Ctx) -> None:
        if ctx.notified and self.notified is not None:
            self.notified()
        for name in ctx.wake:
            self.wake(name)
        if ctx.wake_pools:
            with self.store.read() as session:
                epoch = self.store.epoch(open=False)  # the batch's: its heads of line are kept in it
                for pool, slots in ctx.wake_pools.items():
                    for name in queuing.first_in_line(session, pool, slots + 1, epoch):
                        self.wake(name, urgent=True)  # a free slot must not wait behind a backlog

    # -- revisions -----------------------------------------------------------------------
    def revision_due(self, ctx: Ctx) -> bool:
        """The job's own version moved on (its spec, a rerun), or, once Completed, it consumed
        an older revision of a dependency that moved on."""
        if revisions.own_revision_due(ctx.obj) is not None:
            return True
        if ctx.phase != Phase.COMPLETED:
            return False
        receipts = [r for r in ctx.status.get("dependencies", []) if r.get("revision") is not None]
        return bool(receipts) and revisions.consumed_older(receipts, self.dep_states([r["job"] for r in receipts]))

    def resume(self, ctx: Ctx) -> Result:
        if ctx.status.get("nextRunAt"):  # suspended during backoff: the rest of the delay still applies
            ctx.move(Phase.BACKOFF, "Resumed", "resumed; the retry waits out its backoff")
        elif ctx.status.get("eligibleAt"):
            ctx.move(Phase.QUEUED, "Resumed", "resumed; back in the queue at its old position")
            self.endings.enqueue(ctx)
        else:
            ctx.move(Phase.WAITING, "Resumed", "resumed")
        self.endings.write(ctx)
        return AGAIN

    # -- Waiting -------------------------------------------------------------------------
    def dep_states(self, names: list[str]) -> DepStates:
        if not names:
            return {}
        with self.store.read() as session:
            return _read_dep_states(session, names)

    def waiting(self, ctx: Ctx) -> Result:
        spec, status = ctx.spec, ctx.status
        states = ctx.dep_states if ctx.dep_states is not None else self.dep_states([d.job for d in spec.depends_on])
        # a receipt's observedAt is when the states were read: the dependency may have completed
        # after this step began (another worker), never after it was observed
        observed = from_epoch(max(ctx.now, self.clock.now())) if states else ctx.now_text
        verdict = dependencies.evaluate(spec.depends_on, states, status.get("dependencies", []), observed)
        status["dependencies"] = verdict.receipts
        if verdict.broken is not None:
            message = dependencies.describe_broken(verdict.broken, spec.depends_on)
            return self.endings.complete(ctx, "Aborted", "DependencyUnsatisfied", message)
        accepted = to_epoch(status["acceptedAt"])
        checks = waits.evaluate(
            spec.wait_for,
            accepted_at=accepted,
            now=ctx.now,
            previous=status.get("waits"),
            probe=lambda cond: self._probe(ctx, cond),
        )
        self._record_waits(ctx, checks)
        if failed := next((c for c in checks if c.fatal), None):
            return self.endings.complete(ctx, "Aborted", "WaitProbeFailed", failed.message)
        conditions_met = waits.gate(spec.wait_for, checks)
        ready = verdict.satisfied and conditions_met
        abort_at = deadlines.wait_abort_deadline(spec, accepted)
        if not ready and deadlines.passed(abort_at, ctx.now):
            # the abort deadline bounds the whole wait: for dependencies and for conditions
            unmet = [] if conditions_met else ["; ".join(c.message for c in checks if not c.satisfied)]
            if not verdict.satisfied:
                unmet.insert(0, f"{waiting_for(verdict.pending)[1]} (dependencies)")
            message = f"past the wait abort deadline: {' and '.join(unmet)}"
            return self.endings.complete(ctx, "Aborted", "WaitAbortDeadline", message)
        if ready:
            self.endings.stop_watching(ctx.name)
            status.setdefault("eligibleAt", ctx.now_text)
            ctx.move(Phase.QUEUED, "Eligible", "dependencies and waits are satisfied")
            return self.admit.queued(ctx)  # eligibility and the admission attempt share one transaction
        if verdict.pending:
            reason, message = waiting_for(verdict.pending)
        else:
            reason, message = "WaitingForConditions", "; ".join(c.message for c in checks if not c.satisfied)
        status["reason"], status["message"] = reason, message
        if ctx.changed():
            self.endings.write(ctx)
        paths = self._watch_paths(ctx, checks)
        recheck = [
            ctx.now + c.recheck_in for c in checks if c.recheck_in is not None and not (paths and c.type == "path")
        ]
        due = deadlines.soonest(ctx.now, *recheck, abort_at, ctx.job_deadline())
        jitter = 0.9 + 0.2 * self.rand.random()
        safety = PATH_SAFETY_POLL if paths else SAFETY_POLL
        return requeue_after(min(safety, due if due is not None else safety) * (jitter if recheck else 1.0))

    def _watch_paths(self, ctx: Ctx, checks: list[waits.Check]) -> bool:
        """Hand unsatisfied path conditions to the path watcher, which wakes the job when one
        appears; True when it took them (then no per-job poll timer is needed for them)."""
        wait_for = ctx.spec.wait_for
        if wait_for is None or not wait_for.conditions:
            return False
        pending = [
            cond
            for cond, check in zip(wait_for.conditions, checks, strict=True)
            if not check.satisfied and cond.path is not None
        ]
        if not pending:
            self.paths.forget(ctx.name)
            return False
        self.paths.watch(ctx.name, [(c.path, c.type, c.interval or waits.PATH_POLL) for c in pending if c.path])
        return True

    def _probe(self, ctx: Ctx, cond: WaitCondition) -> tuple[bool, str] | None:
        return self.probes.verdict(ctx.name, ctx.uid, cond, ctx.spec.host_dir, ctx.spec.env)

    def _record_waits(self, ctx: Ctx, checks: list[waits.Check]) -> None:
        """Write each evaluation, but an unchanged result only every WAIT_STATUS_REFRESH s."""
        previous = ctx.status.get("waits", [])
        fresh = [{"type": c.type, "satisfied": c.satisfied, "message": c.message} for c in checks]
        same = len(previous) == len(fresh) and all(
            p.get("satisfied") == f["satisfied"] and p.get("message") == f["message"]
            for p, f in zip(previous, fresh, strict=True)
        )
        last = min((to_epoch(p["lastCheckedAt"]) for p in previous if p.get("lastCheckedAt")), default=0.0)
        if same and ctx.now - last < WAIT_STATUS_REFRESH:
            return
        ctx.status["waits"] = [
            {"type": c.type, "satisfied": c.satisfied, "message": c.message, "lastCheckedAt": ctx.now_text}
            for c in checks
        ]

    # -- Backoff -------------------------------------------------------------------------
    def backoff(self, ctx: Ctx) -> Result:
        next_run = ctx.status.get("nextRunAt")
        at = to_epoch(next_run) if next_run else ctx.now
        if ctx.now < at:
            return requeue_after(deadlines.soonest(ctx.now, at, ctx.job_deadline()))
        ctx.status.pop("nextRunAt", None)
        ctx.move(Phase.QUEUED, "BackoffElapsed", "backoff elapsed; queued at its old position")
        return self.admit.queued(ctx)


def _read_dep_states(session: Any, names: list[str]) -> DepStates:
    """The states of the named jobs as their dependents see them (None for a job that does not
    exist), in one snapshot."""
    return _dep_states(repo.statuses(session, kind="Job", names=names) if names else {}, names)


def _dep_states(found: dict[str, repo.Observed], names: list[str]) -> DepStates:
    return {name: revisions.seen_by_dependents(o) if (o := found.get(name)) else None for name in names}
