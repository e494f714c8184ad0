"""Imperative controls (cancel, suspend, resume, rerun) and `run`, the one-off job. Each is a
small compare-and-swap on the job's spec or annotations; the controller does the rest."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from pydantic import ValidationError

from .api.annotations import CANCEL, CANCEL_REASON, CREATED_BY, DOWNSTREAM_SUFFIX, LOST_RUN, RERUN
from .api.job import Job
from .api.kinds import KINDS
from .api.meta import dump, format_time, utcnow
from .api.oneoff import OneOff as OneOff  # where the verbs and the wire have always found it
from .api.status import Outcome, Phase, first_events, new_job_status
from .api.validation import Built, validate_apply
from .errors import Conflict, InvalidInput, NotFound
from .problems import field_problems
from .selectors import Requirement, matches
from .store import Store, StoredObject, eventlog, specview
from .store import repository as repo
from .store import scheduling as sched
from .store.transactions import Tx


def _job(tx: Tx, name: str) -> StoredObject:
    obj = repo.get(tx.session, kind="Job", name=name)
    if obj is None:
        raise NotFound(f'jobs "{name}" not found')
    return obj


def cancel(store: Store, name: str, *, by: str | None = None) -> str:
    """Ask for the job's current revision to be cancelled; `by` says who or what asked, and
    the cancelled job's message says it."""
    with store.write() as tx:
        obj = _job(tx, name)
        status = obj.status or {}
        if status.get("phase") == Phase.COMPLETED:
            return f"already completed ({status.get('outcome')})"
        revision = str(status.get("revision", 1))
        if obj.annotations.get(CANCEL) != revision:
            annotations = {k: v for k, v in obj.annotations.items() if k != CANCEL_REASON}
            annotations[CANCEL] = revision
            if by:
                annotations[CANCEL_REASON] = by
            obj = repo.update_object(tx, obj, annotations=annotations)
            asked = f"cancellation of revision {revision} requested" + (f" ({by})" if by else "")
            eventlog.record(tx, eventlog.ObjectEvent(obj, "CancelRequested", asked))
    return "cancel requested"


def set_suspend(store: Store, name: str, suspend: bool) -> str:
    with store.write() as tx:
        obj = _job(tx, name)
        if bool(obj.spec.get("suspend")) == suspend:
            return "unchanged"
        obj = repo.update_object(tx, obj, spec={**obj.spec, "suspend": suspend})
        eventlog.record(
            tx,
            eventlog.ObjectEvent(
                obj,
                "SuspendRequested" if suspend else "ResumeRequested",
                "suspend requested" if suspend else "resume requested",
            ),
        )
    return "suspended" if suspend else "resumed"


def rerun(store: Store, name: str, *, downstream: bool) -> str:
    with store.write() as tx:
        obj = _job(tx, name)
        phase = (obj.status or {}).get("phase") or Phase.WAITING
        if phase != Phase.COMPLETED:
            raise Conflict(f'job "{name}" is {phase}; only a completed job can be rerun')
        _check_fits(tx, [obj])
        _request_rerun(tx, obj, _rerun_token(downstream))
    return "rerun requested"


def _check_fits(tx: Tx, jobs: list[StoredObject]) -> None:
    """A Conflict when a job to rerun needs more slots than its pool or the global limit has
    (lowered since it ran: a finished job does not hold a pool's size up): queued again, it
    would wait for ever. A paused pool (0) is no such case: its jobs wait until it is raised."""
    facts: dict[str, sched.PoolFacts] = {}
    for obj in jobs:
        slots = int(obj.spec.get("slots", 1))
        for pool in ["global"] + ([obj.spec["pool"]] if obj.spec.get("pool") else []):
            if pool not in facts:
                facts[pool] = sched.pool_facts(tx.session, pool)
            cap = facts[pool].capacity
            if cap and slots > cap:
                raise Conflict(
                    f'job "{obj.name}" needs {slots} slots and pool {pool!r} has {cap}: raise the pool to rerun it'
                )


_AUTO_NAME = re.compile(r"job-(\d+)")


def run_job(store: Store, one_off: OneOff) -> str:
    """Store a one-off job; unnamed jobs get job-1, job-2, ... (in one transaction). Returns
    its name. The same whole-set checks as apply, naming the field of a bad option."""
    try:
        job = Job.model_validate({"metadata": {"name": one_off.name or "placeholder"}, "spec": one_off.spec()})
    except ValidationError as exc:
        problems = field_problems(exc)
        raise InvalidInput("; ".join(problems), problems) from None
    with store.write() as tx:
        if one_off.name is None:
            taken = repo.names_starting(tx.session, kind="Job", prefix="job-")
            numbers = [int(m.group(1)) for n in taken if (m := _AUTO_NAME.fullmatch(n))]
            job.metadata.name = f"job-{max(numbers, default=0) + 1}"
        elif repo.version(tx.session, kind="Job", name=job.metadata.name) is not None:
            raise Conflict(f'jobs "{job.metadata.name}" already exists')
        problems = validate_apply([Built(KINDS["Job"], job)], specview.SpecView(tx.session))
        if problems:
            raise InvalidInput(problems[0], problems)
        obj = repo.create(
            tx,
            kind="Job",
            name=job.metadata.name,
            spec=dump(job)["spec"],
            labels=job.metadata.labels,
            annotations={CREATED_BY: "run"},
            status=dict(
                new_job_status(format_time(utcnow()), [d.job for d in job.spec.depends_on], suspended=job.spec.suspend)
            ),
        )
        # stored as the controller's first look would leave it: said as it would say it
        said = [eventlog.ObjectEvent(obj, reason, message) for reason, message in first_events(obj.status)]
        eventlog.record(tx, eventlog.ObjectEvent(obj, "Created", "job created by run"), *said)
    return job.metadata.name


def rerun_failed(store: Store, selector: list[Requirement] | None) -> list[str]:
    """`rerun --failed`: every completed job (matching `selector`) whose outcome is not
    Succeeded runs again, and what depends on it after it; requested in one transaction.
    Returns their names (none: nothing was written)."""
    return _rerun_all(store, selector, failed_only=True, downstream=True)


def rerun_selected(store: Store, selector: list[Requirement], *, downstream: bool) -> list[str]:
    """`rerun -l SEL`: every job matching `selector`, in one transaction; a Conflict, and
    nothing requested, when one of them is not completed."""
    return _rerun_all(store, selector, failed_only=False, downstream=downstream)


def _rerun_all(store: Store, selector: list[Requirement] | None, *, failed_only: bool, downstream: bool) -> list[str]:
    def chosen(obj: StoredObject) -> bool:
        if selector is not None and not matches(selector, obj.labels):
            return False
        status = obj.status or {}
        return not failed_only or (
            obj.deleted_at is None
            and status.get("phase") == Phase.COMPLETED
            and status.get("outcome") != Outcome.SUCCEEDED
        )

    with store.read() as session:  # the whole store is looked at without holding the write lock
        names = [o.name for o in repo.list_objects(session, kind="Job") if chosen(o)]
    if not names:
        return []
    with store.write() as tx:  # what was picked is checked again where it is written
        objs = [o for o in repo.list_objects(tx.session, kind="Job", names=names) if chosen(o)]
        if busy := [o for o in objs if (o.status or {}).get("phase") != Phase.COMPLETED]:
            states = ", ".join(f"{o.name} is {(o.status or {}).get('phase') or Phase.WAITING}" for o in busy)
            raise Conflict(f"only completed jobs can be rerun: {states}")
        _check_fits(tx, objs)
        token = _rerun_token(downstream)
        for obj in objs:
            _request_rerun(tx, obj, token)
    return [o.name for o in objs]


def _rerun_token(downstream: bool) -> str:
    """A new token asks for a new revision; the suffix lets dependents follow."""
    return f"{time.time():.6f}" + (DOWNSTREAM_SUFFIX if downstream else "")


def _request_rerun(tx: Tx, obj: StoredObject, token: str) -> None:
    obj = repo.update_object(tx, obj, annotations={**obj.annotations, RERUN: token})
    downstream = token.endswith(DOWNSTREAM_SUFFIX)
    message = "rerun requested" + (" with its dependents" if downstream else "")
    eventlog.record(tx, eventlog.ObjectEvent(obj, "RerunRequested", message))


# -- node maintenance: cordon, uncordon, drain ---------------------------------------------------


def _node(tx: Tx, name: str) -> StoredObject:
    obj = repo.get(tx.session, kind="Node", name=name)
    if obj is None:
        raise NotFound(f'nodes "{name}" not found')
    return obj


def _set_unschedulable(tx: Tx, obj: StoredObject, unschedulable: bool) -> str:
    if bool(obj.spec.get("unschedulable")) == unschedulable:
        return "unchanged"
    obj = repo.update_object(tx, obj, spec={**obj.spec, "unschedulable": unschedulable})
    if unschedulable:
        event = eventlog.ObjectEvent(obj, "Cordoned", "cordoned: no new run is placed here")
    else:
        event = eventlog.ObjectEvent(obj, "Uncordoned", "uncordoned: new runs may be placed here again")
    eventlog.record(tx, event)
    return "cordoned" if unschedulable else "uncordoned"


def set_unschedulable(store: Store, name: str, unschedulable: bool) -> str:
    """`cordon` (True) and `uncordon` (False): cordoned | uncordoned | unchanged. Runs placed
    there before go on; placement skips a cordoned node."""
    with store.write() as tx:
        return _set_unschedulable(tx, _node(tx, name), unschedulable)


DRAIN_EVENT_RUNS = 10  # runs named in the node's event; each job's own event names its run


@dataclass(frozen=True)
class Drained:
    """What `drain` did in its one transaction; the waiting is `drain.wait_drained`."""

    node: str
    cordoned: str  # cordoned | unchanged
    declared_lost: list[tuple[str, int]]  # (job, run number) that --force declared lost


def drain(store: Store, name: str, *, force: bool) -> Drained:
    """Cordon the node and, with `force`, record on every job holding slots there that its
    run is lost (annotation LOST_RUN, "RUN@NODE"): the operator's word that nothing of it runs
    any more. The controller stops what is left and records the run Lost (NodeLost). One
    transaction: the runs marked are every run placed there, for none can be placed after
    the cordon."""
    with store.write() as tx:
        cordoned = _set_unschedulable(tx, _node(tx, name), True)
        lost: list[tuple[str, int]] = []
        if not force:
            return Drained(name, cordoned, lost)
        for held in sched.admissions_on(tx.session, name):
            job = repo.get(tx.session, kind="Job", name=held.name)
            if job is None or job.uid != held.uid:
                continue
            lost.append((held.name, held.run_number))
            mark = f"{held.run_number}@{name}"
            if job.annotations.get(LOST_RUN) == mark:
                continue  # asked before: it stands
            job = repo.update_object(tx, job, annotations={**job.annotations, LOST_RUN: mark})
            message = f"node {name} drained with --force: run {held.run_number} declared lost"
            eventlog.record(tx, eventlog.ObjectEvent(job, "NodeDrained", message, warning=True))
        if lost:
            runs = ", ".join(f"job/{job} run {number}" for job, number in lost[:DRAIN_EVENT_RUNS])
            more = f" and {len(lost) - DRAIN_EVENT_RUNS} more" if len(lost) > DRAIN_EVENT_RUNS else ""
            event = eventlog.ObjectEvent(_node(tx, name), "DrainForced", f"drain --force: declared lost {runs}{more}")
            eventlog.record(tx, event)
    return Drained(name, cordoned, lost)
