"""What one reconcile of one job works on, and the single write that ends each step."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .. import telemetry
from ..api import revisions
from ..api.annotations import CANCEL, CANCEL_REASON
from ..api.job import JobSpec
from ..api.meta import from_epoch, to_epoch
from ..api.notifier import RETRYING, STARTED
from ..api.status import JobStatusDict, Phase, RunDict, phase_of
from ..jsontext import parse
from ..store import Store, StoredObject, eventlog
from ..store import repository as repo
from . import deadlines, notices
from .transitions import Event, move

if TYPE_CHECKING:
    from ..store.transactions import Tx

RETRY_SCHEDULED = "BackoffScheduled"  # the reason of a move to Backoff after a failed run: notifiers' Retrying


@dataclass
class Ctx:
    obj: StoredObject
    spec: JobSpec
    now: float
    status: JobStatusDict = field(default_factory=lambda: cast(JobStatusDict, {}))
    events: list[Event] = field(default_factory=list)
    ops: list[Callable[[Tx], object]] = field(default_factory=list)  # scheduling rows, written with the status
    wake: set[str] = field(default_factory=set)
    wake_pools: dict[str | None, int] = field(default_factory=dict)  # released slots per scope (None = global)
    dep_states: dict[str, revisions.DepState | None] | None = None  # dependency states read with the job, if any
    written: bool = False  # a commit made `obj` the latest stored state
    annotations: dict[str, str] | None = None  # new annotations, written with the status (a request spent)
    notices: list[notices.Notice] = field(default_factory=list)  # notifier events of the moves since the last write
    notified: bool = False  # a commit wrote outbox rows: the deliverer is woken after the step
    seen_in: object | None = None  # the store's batch epoch `obj` was read or written in, if any

    def current(self, store: Store) -> bool:
        """Whether `obj` is certainly the stored state: it was read or written in this
        thread's batch epoch (`Store.epoch`), in which no other writer has committed."""
        return self.seen_in is not None and store.epoch() is self.seen_in

    def __post_init__(self) -> None:
        if not self.status:  # a private copy: decoding the stored text is cheaper than deepcopy
            text = self.obj.status_text
            self.status = cast(JobStatusDict, parse(text)) if text else {"phase": Phase.WAITING, "revision": 1}

    def released(self, pool: str | None, slots: int) -> None:
        """Slots came free: after the write, wake as many jobs first in line as could use them."""
        for scope in {pool, None}:
            self.wake_pools[scope] = self.wake_pools.get(scope, 0) + slots

    @property
    def name(self) -> str:
        return self.obj.name

    @property
    def uid(self) -> str:
        return self.obj.uid

    @functools.cached_property
    def now_text(self) -> str:  # a step stamps several fields with its one `now`
        return from_epoch(self.now)

    @property
    def phase(self) -> Phase:
        return phase_of(self.status)

    @property
    def revision(self) -> int:
        return int(self.status.get("revision", 1))

    def move(
        self, to: Phase, reason: str, message: str, *, outcome: str | None = None, event: str | None = None
    ) -> None:
        before = self.phase
        self.events.append(
            move(
                self.status, to, reason=reason, message=message, now=self.now_text, outcome=outcome, event_reason=event
            )
        )
        if outcome is not None:
            self._notice(outcome, reason)
        elif to == Phase.RUNNING and before != Phase.RUNNING:  # a run started (not a service between runs)
            self._notice(STARTED, reason)
        elif to == Phase.BACKOFF and reason == RETRY_SCHEDULED:
            self._notice(RETRYING, reason)

    def _notice(self, event: str, reason: str) -> None:
        """The event as this move says it: its reason, the run it is about, and its time (a
        start's is the run's start, which a step may write later, with its end)."""
        runs = self.runs_this_revision()
        run = runs[-1] if runs else None
        at = self.now
        if event == STARTED and run is not None and (started := run.get("startedAt")):
            at = to_epoch(started)
        self.notices.append(notices.Notice(event, reason, run["number"] if run is not None else None, at))

    def note(self, reason: str, message: str, *, warning: bool = False) -> None:
        """An event without a phase change."""
        self.events.append(Event(reason, message, warning))

    def runs_this_revision(self) -> list[RunDict]:
        return [r for r in self.status.get("runs", []) if r.get("revision") == self.revision]

    def open_run(self) -> RunDict | None:
        runs = self.status.get("runs", [])
        return runs[-1] if runs and runs[-1].get("finishedAt") is None else None

    def cancel_requested(self) -> bool:
        return self.obj.annotations.get(CANCEL) == str(self.revision)

    def cancel_message(self) -> str:
        """The cancelled job's message: who or what asked, when they said."""
        by = self.obj.annotations.get(CANCEL_REASON)
        return f"cancelled by {by}" if by else "cancelled by request"

    def spec_changed(self) -> bool:
        return revisions.spec_changed(self.obj)

    def job_deadline(self) -> float | None:
        """When the job times out: its timeout after acceptance, not counting the time it
        was Suspended (as Kubernetes stops a suspended Job's deadline); none while Suspended."""
        accepted = self.status.get("acceptedAt")
        if not accepted or "suspendedAt" in self.status or self.phase == Phase.SUSPENDED:
            return None  # (a job suspended before suspendedAt was kept has none: its clock stops too)
        return deadlines.job_deadline(self.spec, to_epoch(accepted) + self.status.get("suspendedSeconds", 0.0))

    def changed(self) -> bool:
        return self.status != (self.obj.status or {})


def count_metrics(before: dict[str, Any], after: JobStatusDict) -> None:
    """What the metrics count of a status change: runs that ended (outcome, reason,
    duration, lost) and an admission (its wait since the job became eligible)."""
    ended_before = {r["number"] for r in before.get("runs", []) if r.get("finishedAt")}
    for run in after.get("runs", []):
        if run.get("finishedAt") and run["number"] not in ended_before:
            reason = run.get("reason") or ""
            telemetry.RUNS.inc(run.get("outcome") or "", reason)
            if run.get("outcome") == "Lost":
                telemetry.RUNS_LOST.inc(reason)
            if started := run.get("startedAt"):
                telemetry.RUN_DURATION.observe(max(0.0, to_epoch(run["finishedAt"]) - to_epoch(started)))
    admission = after.get("admission")
    if admission and not before.get("admission") and (eligible := after.get("eligibleAt")):
        telemetry.ADMISSION_WAIT.observe(max(0.0, to_epoch(admission["admittedAt"]) - to_epoch(eligible)))


def commit(tx: Tx, ctx: Ctx) -> StoredObject:
    """Write status once (compare-and-swap), apply the step's scheduling operations and
    append its events, all in the caller's one transaction. The compare-and-swap goes first:
    a `Conflict` then leaves nothing written (a batch of steps goes on without this one)."""
    ctx.status["observedGeneration"] = ctx.obj.generation
    ctx.status["specHash"] = revisions.spec_hash(ctx.obj.spec_text)
    obj = repo.update_object(
        tx,
        ctx.obj,
        status=cast(dict[str, Any], ctx.status),
        annotations=ctx.annotations,
        certain=ctx.current(tx.store),
    )
    tx.store.mark(ctx.uid)  # in a batch: written, not yet committed (a spawn waits for it)
    for op in ctx.ops:
        op(tx)
    count_metrics(ctx.obj.status or {}, ctx.status)
    eventlog.record(tx, *(eventlog.ObjectEvent(obj, e.reason, e.message, e.warning) for e in ctx.events))
    if ctx.notices:
        ctx.notified |= notices.record(tx, obj, ctx.notices)
    ctx.obj, ctx.written, ctx.annotations, ctx.seen_in = obj, True, None, tx.store.epoch()
    ctx.ops.clear()
    ctx.events.clear()
    ctx.notices.clear()
    return obj
