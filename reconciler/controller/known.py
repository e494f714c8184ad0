"""Jobs as the reconcile thread last read or wrote them, kept for as long as the store's batch
epoch lasts (`Store.epoch`: no other writer has committed since, but for this process's
epoch-safe commits, which change no job), so that they are as stored and the next step of a
job, or of a job that depends on it, reads none of them again (on PostgreSQL each read is a
round trip). Any other writer's commit ends the epoch, and with it everything kept."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..api import revisions
from ..jsontext import parse
from ..store import StoredObject

MAX_KNOWN = 4096  # jobs kept at most; the oldest goes first (a 100,000-job store keeps its memory)


@dataclass(frozen=True, slots=True)
class _AsStored:
    """A kept job's fields as stored, for the dependency rules (revisions.Versioned): the
    status decoded from the text written, as a step may still hold the dict it wrote."""

    name: str
    uid: str
    generation: int
    annotations: dict[str, str]
    spec_text: str
    status: Any


class _Kept(threading.local):
    def __init__(self) -> None:
        self.jobs: dict[str, StoredObject] = {}
        self.epoch: object | None = None  # the epoch every job kept was read or written in


class Known:
    """What each worker thread keeps, apart: an epoch is one thread's (`Store.epoch`)."""

    def __init__(self) -> None:
        self._kept = _Kept()

    def get(self, name: str, epoch: object | None) -> StoredObject | None:
        """The job as stored, if it was kept in `epoch` (None: not kept, or no longer known)."""
        kept = self._kept
        return kept.jobs.get(name) if epoch is not None and epoch is kept.epoch else None

    def put(self, obj: StoredObject, epoch: object | None) -> None:
        """Keep `obj`, read or written in `epoch`, the latest. A job marked for deletion is not
        kept: the step that finishes its deletion removes the row without writing an object."""
        if epoch is None or obj.deleted_at is not None:
            self.drop(obj.name)
            return
        kept = self._kept
        if epoch is not kept.epoch:  # another writer committed: what was kept is of no use now
            kept.jobs.clear()
            kept.epoch = epoch
        jobs = kept.jobs
        jobs.pop(obj.name, None)  # to the end: the oldest is dropped first
        if len(jobs) >= MAX_KNOWN:
            del jobs[next(iter(jobs))]
        jobs[obj.name] = obj

    def drop(self, name: str) -> None:
        self._kept.jobs.pop(name, None)

    def clear(self) -> None:
        """Forget what this thread kept (its batch's writes were lost)."""
        self._kept.jobs.clear()
        self._kept.epoch = None

    def dep_states(self, names: list[str], epoch: object | None) -> dict[str, revisions.DepState | None] | None:
        """The named jobs' states as their dependents see them, if every one of them is kept
        in `epoch`; else None (they are read)."""
        found: dict[str, revisions.DepState | None] = {}
        for name in names:
            obj = self.get(name, epoch)
            if obj is None:
                return None
            status = parse(obj.status_text) if obj.status_text else {}
            found[name] = revisions.seen_by_dependents(
                _AsStored(obj.name, obj.uid, obj.generation, obj.annotations, obj.spec_text, status)
            )
        return found
