"""The writes that end a step, shared by the job's steps (job.py) and its run's steps
(runs.py): write the status, complete the job, finish a deletion, start a new revision, put
the job back in line. Also what this process remembers between steps: who depends on whom,
the admissions it just made, the completions it has already told dependents about."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..api.annotations import DOWNSTREAM_SUFFIX, RERUN
from ..api.meta import to_epoch
from ..api.revisions import rerun_token
from ..api.status import Outcome, Phase, next_revision, phase_of
from ..store import Store, eventlog, queuing
from ..store import repository as repo
from ..store import scheduling as sched
from . import faults, notices
from .context import Ctx, commit, count_metrics
from .runtime import AGAIN, DONE, Result

if TYPE_CHECKING:
    from ..agent.probe import Probes
    from ..store.transactions import Tx
    from .pathwatch import PathWatch


# Phases a job reaches only through an admission, whose transaction deleted its queue row.
_ADMITTED = frozenset({Phase.STARTING, Phase.RUNNING, Phase.STOPPING})


class Endings:
    def __init__(
        self,
        store: Store,
        *,
        paths: PathWatch,
        probes: Probes,
        wake: Callable[..., None],
        remove_runs: Callable[[str, str], None],
    ):
        self.store = store
        self.remove_runs = remove_runs  # (job, uid): the folders of its runs on this node
        self.paths = paths
        self.probes = probes
        self.wake = wake
        self.dependents: defaultdict[str, set[str]] = defaultdict(set)
        self.admitted: dict[str, sched.Admission] = {}  # admissions this process just made, by uid, until Starting
        self._completed_here: set[str] = set()  # completions of this process, not yet looked at again

    def forget(self) -> None:
        """Writes of this process were lost: the admissions and completions remembered from
        them may never have been stored (both are only shortcuts; the store says the truth)."""
        self.admitted.clear()
        self._completed_here.clear()

    def write(self, ctx: Ctx) -> None:
        with self.store.write(known=True) as tx:
            commit(tx, ctx)

    def stop_watching(self, name: str) -> None:
        """The job no longer waits: drop its path and probe checks."""
        self.paths.forget(name)
        self.probes.forget(name)

    def wake_dependents(self, name: str) -> None:
        for dependent in list(self.dependents.get(name, ())):
            self.wake(dependent)

    def seen_own_completion(self, name: str) -> bool:
        """True once, when a step looks at a completion this process wrote (whose dependents
        it has woken already); False for a completion written by another controller."""
        if name in self._completed_here:
            self._completed_here.discard(name)
            return True
        return False

    def complete(self, ctx: Ctx, outcome: str, reason: str, message: str) -> Result:
        self.stop_watching(ctx.name)
        self.admitted.pop(ctx.uid, None)
        self._completed_here.add(ctx.name)
        if phase_of(ctx.obj.status) not in _ADMITTED:  # an admission took the job's queue row with it
            ctx.ops.append(lambda tx: queuing.dequeue(tx, ctx.uid))
        ctx.move(Phase.COMPLETED, reason, message, outcome=outcome)
        self.write(ctx)
        faults.point("after-completion", self.store.flush)  # completed, its notifications in the outbox, none delivered
        self.wake_dependents(ctx.name)
        return DONE

    def finalize_delete(self, ctx: Ctx) -> Result:
        """Remove the job. One deleted while admitted was cancelled first (API.md, `delete`):
        its run stopped, its notifiers hear Cancelled (reason Deleted), written with the removal."""
        self.stop_watching(ctx.name)
        self.admitted.pop(ctx.uid, None)
        with self.store.write(known=True) as tx:
            repo.remove(tx, ctx.obj)  # first: a Conflict leaves nothing written
            count_metrics(ctx.obj.status or {}, ctx.status)  # its run stopped for the deletion ended
            queuing.dequeue(tx, ctx.uid)
            if sched.release(tx, ctx.uid) is not None:
                ctx.released(ctx.spec.pool, ctx.spec.slots)
            eventlog.record(tx, eventlog.ObjectEvent(ctx.obj, "Deleted", "job deleted"))
            if ctx.phase in _ADMITTED:
                runs = ctx.runs_this_revision()
                run = runs[-1]["number"] if runs else None
                cancelled = notices.Notice(Outcome.CANCELLED, "Deleted", run, ctx.now)
                ctx.notified |= notices.record(tx, ctx.obj, [cancelled])
        # its runs' folders (logs, an artifact's files) go with it, as a deleted pod's do
        self.store.on_commit(lambda: self.remove_runs(ctx.name, ctx.uid))
        self.wake_dependents(ctx.name)
        return DONE

    def start_revision(self, ctx: Ctx) -> Result:
        """A new revision (the spec changed, a rerun, a dependency's newer revision), or, for
        a job that never ran, a fresh look at the changed spec."""
        self._completed_here.discard(ctx.name)
        self.probes.forget(ctx.name)  # the new revision's waits start afresh
        status = ctx.status
        ran = bool(ctx.runs_this_revision()) or ctx.phase == Phase.COMPLETED
        if ran:
            next_revision(status, ctx.now_text)
        token = rerun_token(ctx.obj)
        # dependents that consumed the old revision follow, unless this is a plain `rerun`
        status["propagate"] = token is None or token.endswith(DOWNSTREAM_SUFFIX)
        status["rerunToken"] = ctx.obj.annotations.get(RERUN)
        message = f"revision {ctx.revision} accepted" if ran else "spec changed before any run; re-evaluating"
        ctx.move(Phase.WAITING, "NewRevision" if ran else "SpecChanged", message)
        ctx.ops.append(lambda tx: queuing.dequeue(tx, ctx.uid))
        self.write(ctx)
        self.wake_dependents(ctx.name)  # they may have consumed the old revision
        return AGAIN

    def enqueue(self, ctx: Ctx) -> None:
        """Put the job in line, with the status write (idempotent: a queued job keeps its row;
        nothing here reads the row, so the insert's answer is not waited for)."""
        ctx.ops.append(self.enqueue_op(ctx))

    @staticmethod
    def enqueue_op(ctx: Ctx) -> Callable[[Tx], Callable[[], queuing.QueueEntry]]:
        """The job's queue row put in place in a transaction; what the operation returns
        gives the row when called (its answer read then)."""
        spec, status = ctx.spec, ctx.status
        eligible = to_epoch(status.get("eligibleAt") or ctx.now_text)
        fresh = phase_of(ctx.obj.status) != Phase.QUEUED  # a job not stored as Queued has no row, as a rule
        return lambda tx: queuing.enqueue(
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
            cpu=spec.resources.cpu or 0.0,
            memory=spec.resources.memory or 0,
            fresh=fresh,
        )
