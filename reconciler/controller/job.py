"""The job reconciler: observe -> decide -> act -> write status once, per step.

`JobReconciler(key)` reads one job, takes the step its phase calls for, and either goes on
to the next step at once (AGAIN) or returns when it wants to be called again. Steps that
concern a live process (Starting, Running, Stopping) are in runs.py."""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Callable

from ..agent.probe import Probes
from ..api.job import JobSpec
from ..api.meta import from_epoch, to_epoch
from ..errors import Conflict
from ..store import Store
from ..store import repository as repo
from ..store import scheduling as sched
from . import admission, deadlines, dependencies, waits
from .context import AGAIN, DOWNSTREAM_SUFFIX, RERUN_ANNOTATION, Ctx, commit
from .pathwatch import PathWatch
from .placement import NodeView, place

SAFETY_POLL = 120.0  # a queued or waiting job looks again at least this often (jittered), whatever wakes it
PATH_SAFETY_POLL = 600.0  # the same for a job whose paths the path watcher checks for it
WAIT_STATUS_REFRESH = 30.0  # unchanged wait results are written back at most this often
MAX_STEPS = 12


class JobReconciler:
    def __init__(
        self,
        store: Store,
        agent,
        *,
        clock,
        wake: Callable[..., None],
        owner: str,
        rand: random.Random | None = None,
        strategy: str = "spread",
    ):
        from .runs import RunSteps

        self.store = store
        self.agent = agent
        self.clock = clock
        self.rand = rand or random.Random()
        self.wake = wake
        self.owner = owner
        self.strategy = strategy
        self.dependents: defaultdict[str, set[str]] = defaultdict(set)
        self._specs: dict[str, JobSpec] = {}
        self.runs = RunSteps(self)
        self.paths = PathWatch(wake, clock)
        self.probes = Probes(wake)
        self._completed_here: set[str] = set()  # completions of this process, not yet looked at again
        self.admitted: dict[str, sched.Admission] = {}  # admissions this process just made, by uid, until Starting

    # -- the entry point -------------------------------------------------------------
    def __call__(self, key: tuple[str, str]) -> float | None:
        name, obj = key[1], None
        for _ in range(MAX_STEPS):
            deps = None
            if obj is None:
                with self.store.read() as session:
                    obj = repo.get(session, kind="Job", name=name)
                    spec = self.spec_of(obj) if obj is not None else None
                    if spec is not None and (obj.status or {}).get("phase", "Waiting") == "Waiting":
                        # what the Waiting step reads next, in the same snapshot
                        deps = self._read_dep_states(session, [d.job for d in spec.depends_on])
            else:
                spec = self.spec_of(obj)
            if obj is None:
                self.paths.forget(name)
                self.probes.forget(name)
                self._wake_dependents(name)
                return None
            ctx = Ctx(obj, spec, self.clock.now(), dep_states=deps)
            try:
                result = self.step(ctx)
            except Conflict:
                obj = None
                continue  # someone wrote the job meanwhile: observe again
            self.after_commit(ctx)
            if result != AGAIN:
                return result
            # the step's own write is the latest state, unless it went elsewhere
            obj = ctx.obj if ctx.written else None
        return 0.0

    def spec_of(self, obj) -> JobSpec:
        spec = self._specs.get(obj.spec_text)
        if spec is None:
            if len(self._specs) > 20_000:
                self._specs.clear()
            spec = self._specs[obj.spec_text] = JobSpec.model_validate(obj.spec)
        for dep in spec.depends_on:
            self.dependents[dep.job].add(obj.name)
        return spec

    def step(self, ctx: Ctx) -> float | None:
        if ctx.phase in ("Starting", "Running", "Stopping"):
            return self.runs.step(ctx)
        if ctx.obj.deleted_at is not None:
            return self.finalize_delete(ctx)
        if self.revision_due(ctx):
            return self.start_revision(ctx)
        if ctx.phase == "Completed":
            if ctx.name in self._completed_here:  # its own completion already woke who waits on it
                self._completed_here.discard(ctx.name)
                return None
            # completed elsewhere (another controller): wake its dependents and whoever may
            # use the slots it freed
            self._wake_dependents(ctx.name)
            ctx.released(ctx.spec.pool, ctx.spec.slots)
            return None
        if ctx.cancel_requested():
            return self.complete(ctx, "Cancelled", "Cancelled", "cancelled by request")
        if deadlines.passed(self.job_deadline(ctx), ctx.now):
            return self.complete(
                ctx, "TimedOut", "DeadlineExceeded", f"the job exceeded its timeout of {ctx.spec.timeout:g}s"
            )
        if ctx.spec.suspend:
            if ctx.phase == "Suspended":
                return None
            self.probes.forget(ctx.name)
            ctx.move("Suspended", "Suspended", "suspended: no new run is admitted")
            ctx.ops.append(lambda tx: sched.dequeue(tx, ctx.uid))
            return self.write(ctx, None)
        if ctx.phase == "Suspended":
            return self.resume(ctx)
        return {"Waiting": self.waiting, "Queued": self.queued, "Backoff": self.backoff}[ctx.phase](ctx)

    # -- writing -----------------------------------------------------------------------
    def write(self, ctx: Ctx, result: float | None) -> float | None:
        with self.store.write() as tx:
            commit(tx, ctx)
        return result

    def after_commit(self, ctx: Ctx) -> None:
        for name in ctx.wake:
            self.wake(name)
        if ctx.wake_pools:
            with self.store.read() as session:
                for pool, slots in ctx.wake_pools.items():
                    for name in sched.first_in_line(session, pool, slots + 1):
                        self.wake(name, urgent=True)  # a free slot must not wait behind a backlog

    def _wake_dependents(self, name: str) -> None:
        for dependent in list(self.dependents.get(name, ())):
            self.wake(dependent)

    def job_deadline(self, ctx: Ctx) -> float | None:
        return (
            deadlines.job_deadline(ctx.spec, to_epoch(ctx.status["acceptedAt"]))
            if ctx.status.get("acceptedAt")
            else None
        )

    # -- endings -------------------------------------------------------------------------
    def complete(self, ctx: Ctx, outcome: str, reason: str, message: str) -> None:
        self.paths.forget(ctx.name)
        self.probes.forget(ctx.name)
        self.admitted.pop(ctx.uid, None)
        self._completed_here.add(ctx.name)
        ctx.move("Completed", reason, message, outcome=outcome)
        ctx.ops.append(lambda tx: sched.dequeue(tx, ctx.uid))
        self.write(ctx, None)
        self._wake_dependents(ctx.name)
        return

    def finalize_delete(self, ctx: Ctx) -> None:
        self.paths.forget(ctx.name)
        self.probes.forget(ctx.name)
        self.admitted.pop(ctx.uid, None)
        with self.store.write() as tx:
            sched.dequeue(tx, ctx.uid)
            if sched.release(tx, ctx.uid) is not None:
                ctx.released(ctx.spec.pool, ctx.spec.slots)
            repo.remove(tx, ctx.obj)
            repo.record_event(tx, ctx.obj, "Deleted", "job deleted")
        self._wake_dependents(ctx.name)
        return

    # -- revisions -----------------------------------------------------------------------
    def revision_due(self, ctx: Ctx) -> bool:
        status = ctx.status
        if ctx.spec_changed():
            return True
        if ctx.phase != "Completed":
            return False
        token = ctx.obj.annotations.get(RERUN_ANNOTATION)
        if token is not None and token != status.get("rerunToken"):
            return True
        return self._dependency_rerun(ctx)

    def _dependency_rerun(self, ctx: Ctx) -> bool:
        """A completed job that consumed an older revision of a dependency runs again."""
        receipts = {r["job"]: r for r in ctx.status.get("dependencies", []) if r.get("revision") is not None}
        if not receipts:
            return False
        states = self.dep_states(list(receipts))
        return any(s is not None and s.propagates and s.revision > receipts[n]["revision"] for n, s in states.items())

    def start_revision(self, ctx: Ctx) -> float:
        self._completed_here.discard(ctx.name)
        self.probes.forget(ctx.name)  # the new revision's waits start afresh
        status = ctx.status
        ran = bool(ctx.runs_this_revision()) or ctx.phase == "Completed"
        if ran:
            status["revision"] = ctx.revision + 1
            status["acceptedAt"] = ctx.now_text
            for key in ("eligibleAt", "startTime", "completionTime", "nextRunAt", "admission", "nodeName", "stop"):
                status.pop(key, None)
            status.update(
                dependencies=[],
                waits=[],
                bypassCount=0,
                conditions=[c for c in status.get("conditions", []) if c["type"] not in ("Completed", "Succeeded")],
            )
        token = ctx.obj.annotations.get(RERUN_ANNOTATION)
        rerun = token is not None and token != status.get("rerunToken")
        # dependents that consumed the old revision follow, unless this is a plain `rerun`
        status["propagate"] = not rerun or token.endswith(DOWNSTREAM_SUFFIX)
        status["rerunToken"] = token
        message = f"revision {ctx.revision} accepted" if ran else "spec changed before any run; re-evaluating"
        ctx.move("Waiting", "NewRevision" if ran else "SpecChanged", message)
        ctx.ops.append(lambda tx: sched.dequeue(tx, ctx.uid))
        self.write(ctx, None)
        self._wake_dependents(ctx.name)  # they may have consumed the old revision
        return AGAIN

    def resume(self, ctx: Ctx) -> float:
        if ctx.status.get("nextRunAt"):  # suspended during backoff: the rest of the delay still applies
            ctx.move("Backoff", "Resumed", "resumed; the retry waits out its backoff")
        elif ctx.status.get("eligibleAt"):
            ctx.move("Queued", "Resumed", "resumed; back in the queue at its old position")
            self._enqueue(ctx)
        else:
            ctx.move("Waiting", "Resumed", "resumed")
        self.write(ctx, None)
        return AGAIN

    # -- Waiting -------------------------------------------------------------------------
    def dep_states(self, names: list[str]) -> dict[str, dependencies.DepState | None]:
        if not names:
            return {}
        with self.store.read() as session:
            return self._read_dep_states(session, names)

    @staticmethod
    def _read_dep_states(session, names: list[str]) -> dict[str, dependencies.DepState | None]:
        found = repo.statuses(session, kind="Job", names=names) if names else {}
        out: dict[str, dependencies.DepState | None] = {}
        for name in names:
            o = found.get(name)
            s = o.status if o else {}
            out[name] = (
                None
                if o is None
                else dependencies.DepState(
                    o.uid,
                    int(s.get("revision", 1)),
                    s.get("phase", "Waiting"),
                    s.get("outcome"),
                    s.get("propagate", True),
                )
            )
        return out

    def waiting(self, ctx: Ctx) -> float | None:
        spec, status = ctx.spec, ctx.status
        states = ctx.dep_states if ctx.dep_states is not None else self.dep_states([d.job for d in spec.depends_on])
        # a receipt's observedAt is when the states were read: the dependency may have completed
        # after this step began (another worker), never after it was observed
        observed = from_epoch(max(ctx.now, self.clock.now())) if states else ctx.now_text
        verdict = dependencies.evaluate(spec.depends_on, states, status.get("dependencies", []), observed)
        status["dependencies"] = verdict.receipts
        if verdict.broken is not None:
            message = dependencies.describe_broken(verdict.broken, spec.depends_on)
            return self.complete(ctx, "Aborted", "DependencyUnsatisfied", message)
        accepted = to_epoch(status["acceptedAt"])
        checks = waits.evaluate(
            spec.wait_for,
            accepted_at=accepted,
            now=ctx.now,
            previous=status.get("waits"),
            probe=lambda cond: self._probe(ctx, cond),
        )
        self._record_waits(ctx, checks)
        if any(c.fatal for c in checks):
            failed = next(c for c in checks if c.fatal)
            return self.complete(ctx, "Aborted", "WaitProbeFailed", failed.message)
        ready = verdict.satisfied and waits.gate(spec.wait_for, checks)
        abort_at = deadlines.wait_abort_deadline(spec, accepted)
        if not ready and deadlines.passed(abort_at, ctx.now):
            return self.complete(
                ctx, "Aborted", "WaitAbortDeadline", "the wait conditions were not met before the abort deadline"
            )
        if ready:
            self.paths.forget(ctx.name)
            self.probes.forget(ctx.name)
            status.setdefault("eligibleAt", ctx.now_text)
            ctx.move("Queued", "Eligible", "dependencies and waits are satisfied")
            return self.queued(ctx)  # eligibility and the admission attempt share one transaction
        reason, message = (
            ("WaitingForDependencies", "waiting for " + ", ".join(verdict.pending))
            if verdict.pending
            else ("WaitingForConditions", "; ".join(c.message for c in checks if not c.satisfied))
        )
        status.update(reason=reason, message=message)
        if ctx.changed():
            self.write(ctx, None)
        paths = self._watch_paths(ctx, checks)
        recheck = [
            ctx.now + c.recheck_in for c in checks if c.recheck_in is not None and not (paths and c.type == "path")
        ]
        due = deadlines.soonest(ctx.now, *recheck, abort_at, self.job_deadline(ctx))
        jitter = 0.9 + 0.2 * self.rand.random()
        safety = PATH_SAFETY_POLL if paths else SAFETY_POLL
        return min(safety, due if due is not None else safety) * (jitter if recheck else 1.0)

    def _watch_paths(self, ctx: Ctx, checks: list[waits.Check]) -> bool:
        """Hand unsatisfied path conditions to the path watcher, which wakes the job when one
        appears; True when it took them (then no per-job poll timer is needed for them)."""
        wait_for = ctx.spec.wait_for
        if wait_for is None or not ctx.spec.wait_for.conditions:
            return False
        pending = [
            cond for cond, check in zip(wait_for.conditions, checks) if not check.satisfied and cond.kind == "path"
        ]
        if not pending:
            self.paths.forget(ctx.name)
            return False
        self.paths.watch(ctx.name, [(c.path, c.type, c.interval or waits.PATH_POLL) for c in pending])
        return True

    def _probe(self, ctx: Ctx, cond) -> tuple[bool, str] | None:
        return self.probes.verdict(ctx.name, ctx.uid, cond, ctx.spec.working_dir)

    def _record_waits(self, ctx: Ctx, checks: list[waits.Check]) -> None:
        """Write each evaluation, but an unchanged result only every WAIT_STATUS_REFRESH s."""
        previous = ctx.status.get("waits", [])
        fresh = [{"type": c.type, "satisfied": c.satisfied, "message": c.message} for c in checks]
        same = len(previous) == len(fresh) and all(
            p.get("satisfied") == f["satisfied"] and p.get("message") == f["message"] for p, f in zip(previous, fresh)
        )
        last = min((to_epoch(p["lastCheckedAt"]) for p in previous if p.get("lastCheckedAt")), default=0.0)
        if same and ctx.now - last < WAIT_STATUS_REFRESH:
            return
        ctx.status["waits"] = [{**f, "lastCheckedAt": ctx.now_text} for f in fresh]

    def _enqueue(self, ctx: Ctx) -> None:
        ctx.ops.append(self._enqueue_op(ctx))

    @staticmethod
    def _enqueue_op(ctx: Ctx) -> Callable:
        spec, status = ctx.spec, ctx.status
        eligible = to_epoch(status.get("eligibleAt") or ctx.now_text)
        return lambda tx: sched.enqueue(
            tx,
            uid=ctx.uid,
            name=ctx.name,
            pool=spec.pool,
            slots=spec.slots,
            priority=spec.priority,
            eligible_at=eligible,
            bypass_count=int(status.get("bypassCount", 0)),
            node_name=spec.placement.node_name,
            node_selector=spec.placement.node_selector,
        )

    # -- Backoff -------------------------------------------------------------------------
    def backoff(self, ctx: Ctx) -> float | None:
        at = to_epoch(ctx.status["nextRunAt"]) if ctx.status.get("nextRunAt") else ctx.now
        if ctx.now < at:
            return deadlines.soonest(ctx.now, at, self.job_deadline(ctx))
        ctx.status.pop("nextRunAt", None)
        ctx.move("Queued", "BackoffElapsed", "backoff elapsed; queued at its old position")
        return self.queued(ctx)

    # -- Queued: admission and placement, one short transaction ---------------------------
    def queued(self, ctx: Ctx) -> float | None:
        spec, status = ctx.spec, ctx.status
        if not ctx.changed() and not self._might_admit(ctx):
            # no room in a finite scope: the decision can only be "wait", so spare the write
            # lock; a release of slots wakes the first in line
            return deadlines.soonest(ctx.now, ctx.now + self._safety(), self.job_deadline(ctx))
        with self.store.write() as tx:
            if repo.version(tx.session, kind="Job", name=ctx.name) != ctx.obj.resource_version:
                raise Conflict(f"job {ctx.name} changed since it was read")  # e.g. another controller admitted it
            me = self._enqueue_op(ctx)(tx)  # idempotent: restores the row after a restart or a resume
            nodes = [
                NodeView(n.name, n.ready, n.unschedulable, n.capacity, n.allocated, n.labels)
                for n in sched.node_facts(tx.session, ctx.now)
            ]
            scopes = self._scopes(tx.session, me, nodes)
            decision = admission.decide(_request(me), scopes)
            placed = (
                place(
                    nodes,
                    slots=spec.slots,
                    node_name=spec.placement.node_name,
                    selector=spec.placement.node_selector,
                    strategy=self.strategy,
                    turn=sched.round_robin_turn(tx) if self.strategy == "round-robin" else 0,
                )
                if decision.admit
                else None
            )
            if decision.admit and placed.node is not None:
                number = max((r["number"] for r in status.get("runs", [])), default=0) + 1
                owner = self.owner if placed.node == self.agent.node else None
                admitted_at = sched.admit(
                    tx,
                    uid=ctx.uid,
                    name=ctx.name,
                    pool=spec.pool,
                    slots=spec.slots,
                    node=placed.node,
                    run_number=number,
                    owner=owner,
                )
                for passed in decision.bypassed:
                    sched.count_bypass(tx, passed.uid)
                status["admission"] = {"pool": spec.pool, "slots": spec.slots, "admittedAt": from_epoch(admitted_at)}
                status["nodeName"] = placed.node
                status["bypassCount"] = me.bypass_count
                ctx.move(
                    "Starting",
                    "Admitted",
                    f"run {number}: {spec.slots} slot(s) granted" + (f" in pool {spec.pool}" if spec.pool else ""),
                )
                ctx.note("Scheduled", placed.message)
                commit(tx, ctx)
                # what Starting would read back at once: it is what this transaction wrote
                self.admitted[ctx.uid] = sched.Admission(placed.node, number, owner)
                return AGAIN
            reason, message = (
                ("Unschedulable", placed.message) if decision.admit else (decision.reason, decision.message)
            )
            if (status.get("reason"), status.get("message")) != (reason, message):
                status.update(reason=reason, message=message)
                if reason == "Unschedulable":
                    ctx.note("FailedScheduling", message, warning=True)
            if ctx.changed() or ctx.ops:
                commit(tx, ctx)
        for scope in scopes:  # a head that fits must not wait for a timer
            if scope.head is not None and scope.head_fits and scope.head.uid != ctx.uid:
                self.wake(scope.head.name, urgent=True)
        return deadlines.soonest(ctx.now, ctx.now + self._safety(), self.job_deadline(ctx))

    def _safety(self) -> float:
        """The safety-net poll, jittered so that a deep queue is not re-checked in one burst."""
        return SAFETY_POLL * (0.5 + self.rand.random())

    def _might_admit(self, ctx: Ctx) -> bool:
        """A cheap read: False when a finite scope has no room for this job, its queue row is
        in place and its status already says so; an admission attempt could then only
        repeat "wait", so the write lock is spared."""
        with self.store.read() as session:
            if sched.queued(session, ctx.uid) is None:
                return True  # restore the row (after a restart) through the full step
            scopes = []
            for pool in ["global"] + ([ctx.spec.pool] if ctx.spec.pool else []):
                f = sched.pool_facts(session, pool)
                scopes.append(admission.Scope(pool, f.capacity, f.used, f.max_bypass, None))
        verdict = admission.decide(admission.Request(ctx.uid, ctx.name, ctx.spec.slots), scopes)
        return verdict.admit or (ctx.status.get("reason"), ctx.status.get("message")) != (
            verdict.reason,
            verdict.message,
        )

    def _scopes(self, session, me: sched.QueueEntry, nodes: list[NodeView]) -> list[admission.Scope]:
        scopes = []
        facts_cache: dict[str, sched.PoolFacts] = {}

        def facts(pool: str) -> sched.PoolFacts:
            if pool not in facts_cache:
                facts_cache[pool] = sched.pool_facts(session, pool)
            return facts_cache[pool]

        def fits_now(entry: sched.QueueEntry) -> bool:
            own = [facts("global")] + ([facts(entry.pool)] if entry.pool else [])
            room = all(f.capacity is None or entry.slots <= f.capacity - f.used for f in own)
            return (
                room
                and place(nodes, slots=entry.slots, node_name=entry.node_name, selector=entry.node_selector).node
                is not None
            )

        # A queued job that no node could take even empty (pinned to a missing, cordoned or
        # NotReady node, a selector nobody matches, more slots than any node has) is
        # Unschedulable, not short of slots: it does not hold its scope's line, or once passed
        # maxBypass times it would stop every younger job until a node for it turns up.
        empty = [dataclasses.replace(n, allocated=0) for n in nodes]

        def could_place(entry: sched.QueueEntry) -> bool:
            return (
                place(empty, slots=entry.slots, node_name=entry.node_name, selector=entry.node_selector).node
                is not None
            )

        for scope_name in ["global"] + ([me.pool] if me.pool else []):
            f = facts(scope_name)
            if f.capacity is None:
                continue
            head = next(
                (
                    e
                    for e in sched.in_line(session, me.pool, scope_is_pool=scope_name != "global")
                    if e.uid == me.uid or could_place(e)
                ),
                None,
            )
            scopes.append(
                admission.Scope(
                    scope_name,
                    f.capacity,
                    f.used,
                    f.max_bypass,
                    _request(head),
                    head is not None and head.uid != me.uid and fits_now(head),
                )
            )
        return scopes


def _request(entry: sched.QueueEntry | None) -> admission.Request | None:
    return None if entry is None else admission.Request(entry.uid, entry.name, entry.slots, entry.bypass_count)
