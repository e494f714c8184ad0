"""Imperative controls (cancel, suspend, resume, rerun, run) and `wait` conditions. Each is
a small compare-and-swap on the job's spec or annotations; the controller does the rest."""

from __future__ import annotations

import re
import time
from typing import Any

import yaml

from .api.kinds import KINDS
from .api.meta import dump
from .api.validation import validate_apply
from .apply import initial_job_status
from .controller.context import CANCEL_ANNOTATION, DOWNSTREAM_SUFFIX, RERUN_ANNOTATION
from .errors import Conflict, InvalidInput, NotFound
from .manifests import Manifest
from .store import Store, StoredObject
from .store import repository as repo
from .store.engine import Tx


def _job(tx: Tx, name: str) -> StoredObject:
    obj = repo.get(tx.session, kind="Job", name=name)
    if obj is None:
        raise NotFound(f'jobs "{name}" not found')
    return obj


def cancel(store: Store, name: str) -> str:
    with store.write() as tx:
        obj = _job(tx, name)
        status = obj.status or {}
        if status.get("phase") == "Completed":
            return f"already completed ({status.get('outcome')})"
        revision = str(status.get("revision", 1))
        if obj.annotations.get(CANCEL_ANNOTATION) != revision:
            obj = repo.update_object(tx, obj, annotations={**obj.annotations, CANCEL_ANNOTATION: revision})
            repo.record_event(tx, obj, "CancelRequested", f"cancellation of revision {revision} requested")
    return "cancel requested"


def set_suspend(store: Store, name: str, suspend: bool) -> str:
    with store.write() as tx:
        obj = _job(tx, name)
        if bool(obj.spec.get("suspend")) == suspend:
            return "unchanged"
        obj = repo.update_object(tx, obj, spec={**obj.spec, "suspend": suspend})
        repo.record_event(
            tx,
            obj,
            "SuspendRequested" if suspend else "ResumeRequested",
            "suspend requested" if suspend else "resume requested",
        )
    return "suspended" if suspend else "resumed"


def rerun(store: Store, name: str, *, downstream: bool) -> str:
    with store.write() as tx:
        obj = _job(tx, name)
        if (obj.status or {}).get("phase") != "Completed":
            raise Conflict(
                f'job "{name}" is {(obj.status or {}).get("phase", "Waiting")}; only a completed job can be rerun'
            )
        token = f"{time.time():.6f}" + (DOWNSTREAM_SUFFIX if downstream else "")
        obj = repo.update_object(tx, obj, annotations={**obj.annotations, RERUN_ANNOTATION: token})
        repo.record_event(tx, obj, "RerunRequested", "rerun requested" + (" with its dependents" if downstream else ""))
    return "rerun requested"


_AUTO_NAME = re.compile(r"job-(\d+)")


def create_job(store: Store, job: Any, *, auto_name: bool) -> str:
    """Store a job built by `run`; unnamed jobs get job-1, job-2, ... (in one transaction)."""
    with store.write() as tx:
        stored_jobs = {o.name: o.spec for o in repo.list_objects(tx.session, kind="Job")}
        if auto_name:
            numbers = [int(m.group(1)) for n in stored_jobs if (m := _AUTO_NAME.fullmatch(n))]
            job.metadata.name = f"job-{max(numbers, default=0) + 1}"
        elif job.metadata.name in stored_jobs:
            raise Conflict(f'jobs "{job.metadata.name}" already exists')
        pools = {o.name: o.spec for o in repo.list_objects(tx.session, kind="Pool")}
        # the same whole-set checks as apply; the job has no file, so drop the file:line prefix
        problems = [
            p.removeprefix("run:1: ")
            for p in validate_apply([Manifest(KINDS["Job"], job, "run", yaml.compose("{}"))], stored_jobs, pools)
        ]
        if problems:
            raise InvalidInput(problems[0], problems)
        obj = repo.create(
            tx,
            kind="Job",
            name=job.metadata.name,
            spec=dump(job)["spec"],
            labels=job.metadata.labels,
            annotations={"reconciler.dev/created-by": "run"},
            status=initial_job_status(),
        )
        repo.record_event(tx, obj, "Created", "job created by run")
    return job.metadata.name


def _own_new_revision(obj: StoredObject) -> bool | None:
    """For a Completed job: None when nothing of its own asks for a new revision; else
    whether that coming revision makes its dependents run again (a spec change does, a
    plain `rerun` does not, `rerun --downstream` does)."""
    from .api.job import execution_hash

    status = obj.status or {}
    recorded = status.get("specHash")
    if recorded is not None and recorded != execution_hash(obj.spec):
        return True
    token = obj.annotations.get(RERUN_ANNOTATION)
    if token is not None and token != status.get("rerunToken"):
        return token.endswith(DOWNSTREAM_SUFFIX)
    return None


def stale_jobs(session, objs: list[StoredObject]) -> set[str]:
    """Names of the Completed jobs among `objs` whose status is about an older version of
    them: their spec changed, a rerun was asked for, or they consumed an older revision of a
    dependency that moved on, or is about to, and propagates. The controller has not caught
    up yet and will run them again, so their outcome answers nothing about the jobs as they
    now stand (API.md section 2, Convergence)."""
    cache: dict[str, StoredObject | None] = {o.name: o for o in objs}
    memo: dict[str, tuple[bool, bool]] = {}  # name -> (stale, its coming revision propagates)

    def load(name: str) -> StoredObject | None:
        if name not in cache:
            cache[name] = repo.get(session, kind="Job", name=name)
        return cache[name]

    def coming(name: str) -> tuple[bool, bool]:
        if name in memo:
            return memo[name]
        memo[name] = (False, False)  # the graph is acyclic when stored; this only guards the walk
        obj = load(name)
        status = (obj.status or {}) if obj is not None else {}
        if obj is None or status.get("phase") != "Completed":
            return memo[name]
        own = _own_new_revision(obj)
        stale, propagates = own is not None, bool(own)
        for receipt in status.get("dependencies", []):
            dep = load(receipt["job"])
            if dep is None or receipt.get("revision") is None:
                continue
            dep_status = dep.status or {}
            moved_on = int(dep_status.get("revision", 1)) > int(receipt["revision"]) and dep_status.get(
                "propagate", True
            )
            if moved_on or all(coming(dep.name)):
                stale = propagates = True
        memo[name] = (stale, propagates)
        return memo[name]

    return {o.name for o in objs if coming(o.name)[0]}


def wait_state(status: dict[str, Any], condition: str, *, stale: bool = False) -> str:
    """'met', 'pending' or 'never' for one job and `condition` (Succeeded | Completed | a
    Completed outcome). A `stale` completion (see `stale_jobs`) is still pending."""
    if status.get("phase") != "Completed" or stale:
        return "pending"
    if condition == "Completed":
        return "met"
    return "met" if status.get("outcome") == condition else "never"
