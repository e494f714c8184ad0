"""When a job runs again (API.md section 2, Convergence), defined once: the controller starts
the new revision by these rules, and the followers of progress (`wait`, `up`) use the same
rules so that they never take a completion describing an older version of a job for an
answer. Pure: the caller passes the objects in."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..jsontext import canonical
from .annotations import DOWNSTREAM_SUFFIX, RERUN
from .status import JobStatusDict, Phase, ReceiptDict


class Versioned(Protocol):
    """What the rules read of a stored job (a store's StoredObject is one)."""

    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def annotations(self) -> dict[str, str]: ...
    @property
    def spec_text(self) -> str: ...
    @property
    def status(self) -> Any: ...


def execution_hash(spec: Mapping[str, Any]) -> str:
    """What a run depends on: the spec without `suspend`, which pauses a job but is not a
    new version of it (so toggling it never starts a new revision)."""
    return _digest(canonical({k: v for k, v in spec.items() if k != "suspend"}))


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


# distinct spec texts whose hash is kept: as many as the controller keeps parsed specs
# (controller/specs.py), so that a burst of that many new jobs, each hashed at every status
# write of its steps, does not compute each again
KEPT_HASHES = 20_000


@functools.lru_cache(maxsize=KEPT_HASHES)
def spec_hash(spec_text: str) -> str:
    """execution_hash of a stored spec (canonical text), computed once per distinct text:
    without `suspend` anywhere in it, the text is what execution_hash would spell."""
    if '"suspend"' not in spec_text:
        return _digest(spec_text)
    return execution_hash(json.loads(spec_text))


@dataclass(frozen=True)
class DepState:
    """What a dependent sees of one dependency."""

    uid: str
    revision: int
    phase: str
    outcome: str | None
    propagates: bool = True  # does this revision make dependents that consumed an older one run again


def dep_state(uid: str, status: JobStatusDict | Mapping[str, Any]) -> DepState:
    return DepState(
        uid,
        int(status.get("revision", 1)),
        status.get("phase") or Phase.WAITING,
        status.get("outcome"),
        bool(status.get("propagate", True)),
    )


def seen_by_dependents(job: Versioned) -> DepState:
    """What a dependent sees of this job: its status, except that a completion is no answer
    while a new revision of the job is asked for (its spec changed, a rerun) and not started
    yet. The dependent waits for that revision instead of being decided on the outcome it
    replaces, which would run it before its dependency's new run and again after it, or end it
    Aborted on a failure that is being rerun (`rerun --failed` asks for both at once)."""
    state = dep_state(job.uid, job.status or {})
    if state.phase == Phase.COMPLETED and own_revision_due(job) is not None:
        return dataclasses.replace(state, phase=Phase.WAITING, outcome=None)
    return state


def spec_changed(job: Versioned) -> bool:
    """A new spec version since the status was last written (suspend alone does not count)."""
    status = job.status or {}
    observed = status.get("observedGeneration")
    if observed is None or observed == job.generation:
        return False
    return bool(status.get("specHash") != spec_hash(job.spec_text))


def rerun_token(job: Versioned) -> str | None:
    """A `rerun` request not honoured yet, or None."""
    token = job.annotations.get(RERUN)
    return token if token is not None and token != (job.status or {}).get("rerunToken") else None


def own_revision_due(job: Versioned) -> bool | None:
    """None when nothing of the job's own asks for a new revision; else whether that coming
    revision makes its dependents run again: a spec change does, a plain `rerun` does not,
    `rerun --downstream` does. A rerun is asked of a completed job only."""
    if spec_changed(job):
        return True
    if (job.status or {}).get("phase") != Phase.COMPLETED:
        return None
    token = rerun_token(job)
    return None if token is None else token.endswith(DOWNSTREAM_SUFFIX)


def consumed_older(receipts: Iterable[ReceiptDict], states: Mapping[str, DepState | None]) -> bool:
    """A receipt records an older revision of a dependency that has moved on, and that new
    revision propagates: the dependent must run again after it."""
    for receipt in receipts:
        recorded = receipt.get("revision")
        state = states.get(receipt["job"])
        if recorded is not None and state is not None and state.propagates and state.revision > recorded:
            return True
    return False


def stale_completions(jobs: Iterable[Versioned], load: Callable[[str], Versioned | None]) -> set[str]:
    """Names of the given jobs that are Completed but describe an older version of
    themselves: their spec changed, a rerun was asked for, or they consumed an older
    revision of a dependency that moved on, or is about to and propagates. The controller
    has not caught up with them yet and will run them again."""
    memo: dict[str, tuple[bool, bool]] = {}  # name -> (stale, its coming revision propagates)

    def coming(name: str, job: Versioned | None) -> tuple[bool, bool]:
        if name in memo:
            return memo[name]
        memo[name] = (False, False)  # the graph is acyclic when stored; this only guards the walk
        status = (job.status or {}) if job is not None else {}
        if job is None or status.get("phase") != Phase.COMPLETED:
            return memo[name]
        own = own_revision_due(job)
        stale, propagates = own is not None, bool(own)
        for receipt in status.get("dependencies", []):
            if receipt.get("revision") is None:
                continue
            dep = load(receipt["job"])
            if dep is None:
                continue
            if consumed_older([receipt], {receipt["job"]: dep_state(dep.uid, dep.status or {})}) or all(
                coming(receipt["job"], dep)
            ):
                stale = propagates = True
        memo[name] = (stale, propagates)
        return memo[name]

    return {job.name for job in jobs if coming(job.name, job)[0]}
