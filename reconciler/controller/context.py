"""What one reconcile of one job works on, and the single write that ends each step."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..api.job import JobSpec, execution_hash
from ..api.meta import from_epoch
from ..store import StoredObject
from ..store import repository as repo
from ..store.engine import Tx
from .transitions import Event, move

AGAIN = -1.0  # a step's result meaning: take the next step now, without a queue round trip

CANCEL_ANNOTATION = "reconciler.dev/cancel-revision"  # value: the revision to cancel
RERUN_ANNOTATION = "reconciler.dev/rerun"  # value: a token; a new token asks for a new revision
DOWNSTREAM_SUFFIX = ";downstream"  # on the rerun token: dependents run again after it too


@dataclass
class Ctx:
    obj: StoredObject
    spec: JobSpec
    now: float
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    ops: list[Callable[[Tx], None]] = field(default_factory=list)
    wake: set[str] = field(default_factory=set)
    wake_pools: dict[str | None, int] = field(default_factory=dict)  # released slots per scope (None = global)
    dep_states: dict[str, Any] | None = None  # dependency states read with the job, if any

    def released(self, pool: str | None, slots: int) -> None:
        """Slots came free: after the write, wake as many jobs first in line as could use them."""
        for scope in {pool, None}:
            self.wake_pools[scope] = self.wake_pools.get(scope, 0) + slots

    written: bool = False  # a commit made `obj` the latest stored state

    def __post_init__(self) -> None:
        if not self.status:  # a private copy: decoding the stored text is cheaper than deepcopy
            text = self.obj.status_text
            self.status = (
                json.loads(text) if text else copy.deepcopy(self.obj.status or {"phase": "Waiting", "revision": 1})
            )

    @property
    def name(self) -> str:
        return self.obj.name

    @property
    def uid(self) -> str:
        return self.obj.uid

    @property
    def now_text(self) -> str:
        return from_epoch(self.now)

    @property
    def phase(self) -> str:
        return self.status.get("phase", "Waiting")

    @property
    def revision(self) -> int:
        return int(self.status.get("revision", 1))

    def move(self, to: str, reason: str, message: str, *, outcome: str | None = None, event: str | None = None) -> None:
        self.events.append(
            move(
                self.status, to, reason=reason, message=message, now=self.now_text, outcome=outcome, event_reason=event
            )
        )

    def note(self, reason: str, message: str, *, warning: bool = False) -> None:
        """An event without a phase change."""
        self.events.append(Event(reason, message, warning))

    def runs_this_revision(self) -> list[dict[str, Any]]:
        return [r for r in self.status.get("runs", []) if r.get("revision") == self.revision]

    def open_run(self) -> dict[str, Any] | None:
        runs = self.status.get("runs", [])
        return runs[-1] if runs and runs[-1].get("finishedAt") is None else None

    def cancel_requested(self) -> bool:
        return self.obj.annotations.get(CANCEL_ANNOTATION) == str(self.revision)

    def spec_changed(self) -> bool:
        """A new spec version since the last observation (suspend alone does not count)."""
        observed = self.status.get("observedGeneration")
        if observed is None or observed == self.obj.generation:
            return False
        return self.status.get("specHash") != _spec_hash(self.obj)

    def changed(self) -> bool:
        return self.status != (self.obj.status or {})


@functools.lru_cache(maxsize=4096)
def _hash_of(spec_text: str) -> str:
    return execution_hash(json.loads(spec_text))


def _spec_hash(obj: StoredObject) -> str:
    """execution_hash of the object's spec, computed once per distinct spec text."""
    return _hash_of(obj.spec_text)


def commit(tx: Tx, ctx: Ctx) -> StoredObject:
    """Apply the step's scheduling operations, write status once (compare-and-swap), and
    append its events, all in the caller's one transaction."""
    for op in ctx.ops:
        op(tx)
    ctx.status["observedGeneration"] = ctx.obj.generation
    ctx.status["specHash"] = _spec_hash(ctx.obj)
    obj = repo.update_object(tx, ctx.obj, status=ctx.status)
    repo.record_typed_events(tx, ((obj, e.reason, e.message, e.warning) for e in ctx.events))
    ctx.obj, ctx.written = obj, True
    ctx.ops.clear()
    ctx.events.clear()
    return obj
