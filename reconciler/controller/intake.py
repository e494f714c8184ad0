"""Messages a Source received, stored as jobs: one write transaction per batch holds the jobs,
the message ids they came from (store/ingested.py), the events and the Source's counts, so
whatever a crash interrupts is either all there or not at all, and the queue is acknowledged
only after it commits (ingest.py). A redelivered message finds its id and creates nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from ..api.annotations import CREATED_BY, MESSAGE_ID
from ..api.kinds import KINDS
from ..api.meta import dump, from_epoch
from ..api.status import new_job_status
from ..api.validation import Built, validate_apply
from ..store import Store, StoredObject, ingested
from ..store import repository as repo
from ..store.engine import Tx
from .messages import Draft

SHOWN_ID = 80  # characters of a message id that events and errors show


@dataclass(frozen=True, slots=True)
class Message:
    """One message as a queue adapter received it."""

    id: str  # the redelivery key: the same on every delivery of the message
    body: bytes
    tag: Any  # the adapter's handle for acknowledging it (a delivery tag, the HTTP queue's id)


Outcome = Literal["created", "duplicate", "rejected"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What became of one message: acknowledged (created, duplicate) or rejected."""

    message: Message
    outcome: Outcome
    job: str | None = None  # created, or found (duplicate)
    problem: str | None = None  # rejected: `field.path: message`


def shown(message_id: str) -> str:
    return message_id if len(message_id) <= SHOWN_ID else message_id[: SHOWN_ID - 3] + "..."


class Intake:
    """One Source's writes. Keeps the next job-N number it will try, so a batch does not
    read every job name (it checks each name it takes, in the transaction)."""

    def __init__(self, store: Store, source: str, uid: str):
        self.store = store
        self.source = source
        self.uid = uid
        self._next_number: int | None = None

    def store_batch(self, batch: list[tuple[Message, Draft]]) -> list[Verdict] | None:
        """Store what the messages ask for, in one transaction; None when the Source is gone
        (or replaced): nothing is written, nothing should be acknowledged."""
        now = time.time()
        with self.store.write() as tx:
            source = repo.get(tx.session, kind="Source", name=self.source)
            if source is None or source.uid != self.uid:
                return None
            made: dict[str, str] = {}  # message id -> job, of this batch (one message may come twice in it)
            verdicts = [self._one(tx, message, d, now, made) for message, d in batch]
            ingested.record(tx, self.source, made.items(), now)
            rejected = [v for v in verdicts if v.outcome == "rejected"]
            if rejected:
                events = [
                    repo.ObjectEvent(source, "MessageRejected", f"message {shown(v.message.id)}: {v.problem}", True)
                    for v in rejected
                ]
                repo.record_events(tx, *events)
            status = dict(source.status or {})
            for outcome in ("created", "duplicate", "rejected"):
                key = "duplicates" if outcome == "duplicate" else outcome
                status[key] = int(status.get(key, 0)) + sum(v.outcome == outcome for v in verdicts)
            status["received"] = int(status.get("received", 0)) + len(verdicts)
            status["lastMessageTime"] = from_epoch(now)
            if rejected:
                status["lastError"] = f"message {shown(rejected[-1].message.id)}: {rejected[-1].problem}"
                status["lastErrorTime"] = status["lastMessageTime"]
            repo.update_object(tx, source, status=status)
        return verdicts

    def _one(self, tx: Tx, message: Message, d: Draft, now: float, made: dict[str, str]) -> Verdict:
        found = made.get(message.id) or ingested.job_of(tx.session, self.source, message.id)
        if found is not None:
            return Verdict(message, "duplicate", job=found)
        if d.job is None:
            return Verdict(message, "rejected", problem=d.problem)
        job = d.job.model_copy(deep=True)  # a redelivery's draft is the same object: never name it twice
        if d.named:
            if repo.version(tx.session, kind="Job", name=job.metadata.name) is not None:
                return Verdict(message, "rejected", problem=f"metadata.name: job {job.metadata.name!r} already exists")
        else:
            job.metadata.name = self._free_name(tx)
        problems = validate_apply([Built(KINDS["Job"], job)], repo.SpecView(tx.session))
        if problems:
            return Verdict(message, "rejected", problem="; ".join(problems))
        annotations = {**job.metadata.annotations, CREATED_BY: f"source/{self.source}", MESSAGE_ID: message.id}
        obj = repo.create(
            tx,
            kind="Job",
            name=job.metadata.name,
            spec=dump(job)["spec"],
            labels=job.metadata.labels,
            annotations=annotations,
            status=dict(new_job_status(from_epoch(now))),
        )
        created = f"job created from source/{self.source} (message {shown(message.id)})"
        repo.record_events(tx, repo.ObjectEvent(obj, "Created", created))
        made[message.id] = obj.name
        return Verdict(message, "created", job=obj.name)

    def _free_name(self, tx: Tx) -> str:
        """job-N, as `run` names: above every job-N there is, the first not taken."""
        if self._next_number is None:
            taken = repo.names_starting(tx.session, kind="Job", prefix="job-")
            self._next_number = 1 + max((int(n[4:]) for n in taken if n[4:].isdecimal()), default=0)
        while repo.version(tx.session, kind="Job", name=f"job-{self._next_number}") is not None:
            self._next_number += 1
        name = f"job-{self._next_number}"
        self._next_number += 1
        return name


def note_connection(store: Store, source: str, uid: str, *, connected: bool, error: str | None) -> None:
    """Say in the Source's status whether its queue is being consumed, and why not; written
    only when that changes, so a broker down for hours costs no write per retry."""
    with store.write() as tx:
        current: StoredObject | None = repo.get(tx.session, kind="Source", name=source)
        if current is None or current.uid != uid:
            return
        status = dict(current.status or {})
        if status.get("connected") == connected and (error is None or status.get("lastError") == error):
            return
        status["connected"] = connected
        if error is not None:
            status.update(lastError=error, lastErrorTime=from_epoch(time.time()))
        repo.update_object(tx, current, status=status)
