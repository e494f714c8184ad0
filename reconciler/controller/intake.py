"""Messages a Source received, stored as jobs: one write transaction per batch holds the jobs,
the message ids they came from (store/ingested.py), the events and the Source's counts, so
whatever a crash interrupts is either all there or not at all, and the queue is acknowledged
only after it commits (ingest.py). A redelivered message finds its id and creates nothing.

A batch costs a handful of statements whatever its size (the ids looked up at once, the names
it takes checked at once, the jobs and events inserted at once): per message, only checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..api.annotations import CREATED_BY, MESSAGE_ID
from ..api.job import JobSpec
from ..api.kinds import KINDS
from ..api.meta import dump, from_epoch
from ..api.status import first_events, new_job_status, settled_when_stored
from ..api.validation import Built, validate_apply
from ..store import Store, StoredObject, eventlog, ingested, specview
from ..store import repository as repo
from ..store.transactions import Tx
from . import specs
from .messages import Draft

SHOWN_ID = 80  # characters of a message id that events and errors show
REMEMBER = 7 * 24 * 3600.0  # seconds a message id is known: a redelivery comes within minutes, not weeks


# The records made per message (Message, Verdict, messages.Draft, eventlog.ObjectEvent) are not
# frozen: a frozen dataclass is made 2.5 times slower (0.6 us against 0.23, each message).
@dataclass(slots=True)
class Message:
    """One message as a queue adapter received it."""

    id: str  # the redelivery key: the same on every delivery of the message
    body: bytes
    tag: Any  # the adapter's handle for acknowledging it (a delivery tag, the HTTP queue's id)
    problem: str | None = None  # the adapter found it malformed: rejected, its body unread


Outcome = Literal["created", "duplicate", "rejected"]


@dataclass(slots=True)
class Verdict:
    """What became of one message: acknowledged (created, duplicate) or rejected."""

    message: Message
    outcome: Outcome
    job: str | None = None  # created, or found (duplicate)
    problem: str | None = None  # rejected: `field.path: message`


def shown(message_id: str) -> str:
    return message_id if len(message_id) <= SHOWN_ID else message_id[: SHOWN_ID - 3] + "..."


@dataclass(frozen=True)
class _Keyed(Built):
    """A job offered to validate_apply under a name of the batch's choosing."""

    key: str = ""

    @property
    def name(self) -> str:
        return self.key


class _Batch:
    """One batch's transaction: what it found and what it will write."""

    def __init__(self, tx: Tx, source: str, batch: list[tuple[Message, Draft]], next_number: int, now: float):
        self.tx = tx
        self.source = source
        self.created_by = f"source/{source}"
        self.accepted_at = from_epoch(now)
        self.known = ingested.jobs_of(tx.session, source, (m.id for m, _ in batch))
        self.view = specview.SpecView(tx.session)
        self.next_number = next_number
        # every name this batch may take or ask for, checked in one statement
        unnamed = sum(1 for _, d in batch if d.job is not None and not d.named)
        self.checked_below = next_number + unnamed  # job-N below it: looked up with the rest
        candidates = [f"job-{n}" for n in range(next_number, self.checked_below)]
        named = [d.job.metadata.name for _, d in batch if d.job is not None and d.named]
        self.taken = {o.name for o in repo.list_objects(tx.session, kind="Job", names=candidates + named)}
        self.rows: list[dict[str, Any]] = []
        self.specs: list[JobSpec] = []  # each row's validated spec, in the rows' order
        # the jobs of the batch that depend on nothing start with one of two statuses: one
        # dict each, spelled once (create_many)
        self.statuses = {s: dict(new_job_status(self.accepted_at, suspended=s)) for s in (False, True)}
        self.passed = self._passed(batch)

    def _passed(self, batch: list[tuple[Message, Draft]]) -> bool:
        """Whether the jobs of the batch that name no other job pass apply's checks, asked in
        one validate_apply call instead of one a job (each call costs more than its checks).
        Such a job's checks (its pool, its slots against the pool's and the global limit) read
        only the store, which the batch does not change (it stores jobs, not pools), so the
        set passes exactly when each would pass alone. False when any fails: then every job
        is checked alone (`one`), which names the failing one's fields."""
        alone = [d.job for _, d in batch if d.job is not None and not d.job.spec.depends_on]
        if not alone:
            return False
        # names of their own, so that no two look like one job named twice (a job named in
        # its message is checked for that against the store in `one`)
        built = [_Keyed(KINDS["Job"], job, key=f"message-{i}") for i, job in enumerate(alone)]
        return not validate_apply(built, self.view)

    def one(self, message: Message, d: Draft) -> Verdict:
        if (found := self.known.get(message.id)) is not None:
            return Verdict(message, "duplicate", job=found)
        if d.job is None:
            return Verdict(message, "rejected", problem=d.problem)
        job = d.job
        if d.named and job.metadata.name in self.taken:
            return Verdict(message, "rejected", problem=f"metadata.name: job {job.metadata.name!r} already exists")
        if not (self.passed and not job.spec.depends_on):
            # the draft's own name may be a placeholder: the checks name fields, not the job
            problems = validate_apply([Built(KINDS["Job"], job)], self.view)
            if problems:
                return Verdict(message, "rejected", problem="; ".join(problems))
        # named only once accepted: a refused message takes no job-N
        if d.named:
            name = job.metadata.name
            if name.startswith("job-") and name[4:].isdecimal():  # as `run` names: above every job-N
                self.next_number = max(self.next_number, int(name[4:]) + 1)
        else:
            name = self._free_name()
        spec = d.spec if d.spec is not None else dump(job.spec)
        self.view.remember("Job", name, spec)
        self.taken.add(name)
        self.known[message.id] = name
        annotations = {**job.metadata.annotations, CREATED_BY: self.created_by, MESSAGE_ID: message.id}
        self.specs.append(job.spec)
        deps = [d.job for d in job.spec.depends_on]
        self.rows.append(
            {
                "kind": "Job",
                "name": name,
                "spec": spec,
                "labels": job.metadata.labels,
                "annotations": annotations,
                "status": (
                    dict(new_job_status(self.accepted_at, deps, suspended=job.spec.suspend))
                    if deps
                    else self.statuses[job.spec.suspend]
                ),
            }
        )
        return Verdict(message, "created", job=name)

    def _free_name(self) -> str:
        """job-N, as `run` names: above every job-N there is, the first not taken."""
        while f"job-{self.next_number}" in self.taken or (
            self.next_number >= self.checked_below
            and repo.version(self.tx.session, kind="Job", name=f"job-{self.next_number}") is not None
        ):
            self.next_number += 1
        name = f"job-{self.next_number}"
        self.next_number += 1
        return name


Settled = Callable[[list[tuple[str, int, str]]], None]  # told (job, resourceVersion, uid) of jobs stored at rest


class Intake:
    """One Source's writes. Keeps the next job-N number it will try, so a batch does not
    read every job name (it checks the names it takes, in the transaction). `settled`, if
    given, is told of the jobs a batch stores that the loop need not look at (suspended),
    inside the batch's transaction, before it commits (controller/settled.py)."""

    def __init__(self, store: Store, source: str, uid: str, settled: Settled | None = None):
        self.store = store
        self.source = source
        self.uid = uid
        self.settled = settled
        self._next_number: int | None = None

    def store_batch(self, batch: list[tuple[Message, Draft]]) -> list[Verdict] | None:
        """Store what the messages ask for, in one transaction; None when the Source is gone
        (or replaced): nothing is written, nothing should be acknowledged."""
        now = time.time()
        with self.store.write() as tx:
            source = repo.get(tx.session, kind="Source", name=self.source)
            if source is None or source.uid != self.uid:
                return None
            if self._next_number is None:
                taken = repo.names_starting(tx.session, kind="Job", prefix="job-")
                self._next_number = 1 + max((int(n[4:]) for n in taken if n[4:].isdecimal()), default=0)
            work = _Batch(tx, self.source, batch, self._next_number, now)
            verdicts = [work.one(message, d) for message, d in batch]
            created = repo.create_many(tx, work.rows)
            message_of = {v.job: v.message.id for v in verdicts if v.outcome == "created"}
            events = []
            at_rest: list[tuple[str, int, str]] = []  # told to `settled`: the loop will not look at them
            for obj, spec in zip(created, work.specs, strict=True):
                if self.settled is not None and settled_when_stored(obj.status):
                    # no model kept for a step that is not coming: kept, thousands of them would
                    # only be walked by the garbage collector (a look after a resume validates)
                    at_rest.append((obj.name, obj.resource_version, obj.uid))
                else:
                    specs.remember(obj.spec_text, spec)  # what the job's first step would validate again
                said = f"job created from source/{self.source} (message {shown(message_of[obj.name])})"
                events.append(eventlog.ObjectEvent(obj, "Created", said))
                # stored as the controller's first look would leave it: said as it would say it
                events += [eventlog.ObjectEvent(obj, reason, message) for reason, message in first_events(obj.status)]
            rejected = [v for v in verdicts if v.outcome == "rejected"]
            events += [
                eventlog.ObjectEvent(source, "MessageRejected", f"message {shown(v.message.id)}: {v.problem}", True)
                for v in rejected
            ]
            eventlog.record(tx, *events)
            ingested.record(tx, self.source, [(message_of[o.name], o.name) for o in created], now)
            repo.update_object(tx, source, status=_counted(source, verdicts, rejected, now))
            if at_rest and self.settled is not None:
                self.settled(at_rest)  # before the commit: no poll sees these jobs without their hints
        self._next_number = work.next_number  # only once committed: a failed batch takes no name
        return verdicts

    def forget(self, now: float) -> int:
        """Forget the message ids ingested more than REMEMBER ago (the table would grow by
        one row a message for ever); how many."""
        with self.store.write() as tx:
            return ingested.forget(tx, self.source, now - REMEMBER)


def _counted(source: StoredObject, verdicts: list[Verdict], rejected: list[Verdict], now: float) -> dict[str, Any]:
    status = dict(source.status or {})
    for outcome, key in (("created", "created"), ("duplicate", "duplicates"), ("rejected", "rejected")):
        status[key] = int(status.get(key, 0)) + sum(v.outcome == outcome for v in verdicts)
    status["received"] = int(status.get("received", 0)) + len(verdicts)
    status["lastMessageTime"] = from_epoch(now)
    if rejected:
        status["lastError"] = f"message {shown(rejected[-1].message.id)}: {rejected[-1].problem}"
        status["lastErrorTime"] = status["lastMessageTime"]
    return status


def note_connection(store: Store, source: str, uid: str, spec_text: str, *, connected: bool, error: str | None) -> None:
    """Say in the Source's status whether its queue is being consumed, and why not; written
    only when that changes, so a broker down for hours costs no write per retry. Only for
    the spec the lane consumes by (`spec_text`): a lane an edit replaced, still failing to
    reach the old queue, must not say so over the new lane's word."""
    with store.write() as tx:
        current = repo.get(tx.session, kind="Source", name=source)
        if current is None or current.uid != uid or current.spec_text != spec_text:
            return
        status = dict(current.status or {})
        if status.get("connected") == connected and (error is None or status.get("lastError") == error):
            return
        status["connected"] = connected
        if error is not None:
            status.update(lastError=error, lastErrorTime=from_epoch(time.time()))
        repo.update_object(tx, current, status=status)
