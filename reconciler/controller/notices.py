"""What a job's status write tells the notifiers: an outbox row per (notifier, event), written
in the same transaction as the status that reports the event, so a crash between the two
cannot lose one.

The notifiers are read in that transaction: one indexed query, and only on the writes that
report an event (a run started, a retry scheduled, a completion). A cached view followed
through the change feed would save that query but could miss a notifier created just
before the write; bench/ measured no difference worth it (docs/architecture.md)."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from ..api.meta import from_epoch
from ..api.notifier import NotifierSpec, event_body
from ..store import outbox

if TYPE_CHECKING:
    from ..store import StoredObject
    from ..store.transactions import Tx

log = logging.getLogger("reconciler.controller")

_specs: dict[str, NotifierSpec | None] = {}  # spec text -> model (None: does not validate)


def _spec(name: str, text: str) -> NotifierSpec | None:
    if text not in _specs:
        if len(_specs) > 1000:
            _specs.clear()
        try:
            _specs[text] = NotifierSpec.model_validate(json.loads(text))
        except ValidationError as exc:  # stored by an older version with looser rules
            log.warning("notifier %s: its stored spec does not validate, so it hears nothing: %s", name, exc)
            _specs[text] = None
    return _specs[text]


@dataclass(frozen=True, slots=True)
class Notice:
    """One event of a job as its move said it, taken at the move: a step may make several
    (a short run's start and end are one write), each with its own reason, run and time."""

    event: str
    reason: str | None
    run: int | None
    at: float  # epoch seconds


def record(tx: Tx, job: StoredObject, events: list[Notice]) -> bool:
    """Write an outbox row for every notifier that hears of one of `events` about `job`, in
    the caller's transaction; True when there is one."""
    # kept for the epoch: an epoch-safe write may not change a Notifier (KEPT_KINDS)
    specs: list[tuple[str, NotifierSpec]] | None = tx.memo.get("notifiers")
    if specs is None:  # once per transaction: a batch of steps shares it, and no step writes a notifier
        found = outbox.notifiers(tx.session)
        specs = tx.memo["notifiers"] = [(name, spec) for name, text in found if (spec := _spec(name, text)) is not None]
    pending: list[outbox.Pending] = []
    for n in events:
        listeners = [name for name, spec in specs if spec.hears(n.event, job.labels)]
        if listeners:
            event_id = str(uuid.uuid4())  # one per event: every notifier and every redelivery carry it
            time = from_epoch(n.at)
            body = event_body(
                event=n.event, name=job.name, uid=job.uid, reason=n.reason, run=n.run, time=time, event_id=event_id
            )
            pending += (outbox.Pending(name, event_id, body, n.at) for name in listeners)
    outbox.add(tx, pending)
    return bool(pending)
