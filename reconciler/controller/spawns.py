"""Runs started off the reconcile thread. A Starting step that spawns a plain run asks for it
here and moves on; one thread (`spawns`) starts the runs as their asks are committed: each
once the batch transaction that admitted it (and claimed its spawn) has committed, and
never if that batch is lost. The reconcile thread meanwhile steps other jobs: a spawn (the
fork server's answer, the cgroup, the exit watch) costs about a millisecond of wall time,
most of it waiting on the kernel and the fork server, which overlaps with the loop's own
work instead of adding to it; and the admissions of one batch share one commit instead of a
commit before each spawn.

Crash safety is the spawn's as before: the admission and the claim are committed before the
process exists, so a controller killed at any point finds the run by its folder (adoption) or
finds no run and starts it; nothing here is durable, nothing needs to be. What the thread
learns goes back to the job's next Starting step (`take`): a run started (its start is written
then, with its end if it is over), one that could not start, or an error the step raises as
its own (and the job's next spawn is made in its step: an error that persists is retried
with the loop's growing backoff). The job is woken for it when a step asked while the spawn
was pending, or when it failed; else the run's exit wakes it, or the step's timer
(START_REPORT)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..threads import critical

if TYPE_CHECKING:
    from ..agent.local import Started
    from ..store import Store

CLOSE_WAIT = 10.0  # seconds a stopping controller waits for the spawn in progress


@dataclass(frozen=True)
class Spawned:
    """A run this process spawned whose start is not written yet."""

    number: int
    started: Started
    started_at: str  # when it was spawned: the run's startedAt
    node: str
    spawned_at: float  # the clock when the spawn returned: its start is written START_REPORT after at the latest


@dataclass(frozen=True)
class SpawnFailed:
    """A spawn that raised: StartFailed (the run ends StartFailed) or another error, which the
    job's step raises as its own (ForkServerUnsure: the step looks for the run next time)."""

    number: int
    error: Exception


class _Pending:
    __slots__ = ("name", "wanted")

    def __init__(self, name: str):
        self.name = name
        self.wanted = False  # a step asked while it was pending: the job is woken when it is done


PENDING: Final = object()  # `take`'s answer while the spawn is asked for and not done


class Spawns:
    def __init__(self, store: Store, wake: Callable[..., None]):
        self.store = store
        self._wake = wake
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}  # job uid -> its spawn, asked for and not done
        self._done: dict[str, Spawned | SpawnFailed] = {}  # job uid -> what its next step takes
        self._todo: queue.SimpleQueue[tuple[str, int, Callable[[], Spawned]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def ask(self, uid: str, name: str, number: int, spawn: Callable[[], Spawned]) -> None:
        """Run `spawn` (run `number` of the job) on the spawns thread once this thread's
        uncommitted writes are committed (at once when there are none); pending until then,
        and forgotten if they are lost."""
        with self._lock:
            if self._closed:
                return  # stopping: the next controller starts it (its admission is committed)
            self._pending[uid] = _Pending(name)
            if self._thread is None:
                self._thread = critical("spawns", self._work)
                self._thread.start()
        self.store.on_commit(lambda: self._todo.put((uid, number, spawn)), or_else=lambda: self._settle(uid, None))

    def take(self, uid: str) -> Spawned | SpawnFailed | object | None:
        """What the job's step acts on: PENDING (the job is woken when it is done), the spawn's
        outcome (once), or None when nothing was asked for it here."""
        with self._lock:
            pending = self._pending.get(uid)
            if pending is not None:
                pending.wanted = True
                return PENDING
            return self._done.pop(uid, None)

    def keep(self, uid: str, outcome: Spawned) -> None:
        """Put back an outcome the step took and did not act on yet."""
        with self._lock:
            self._done[uid] = outcome

    def close(self) -> None:
        """Start nothing more, from now on; wait for the spawn in progress (at most
        CLOSE_WAIT). A run asked for and not started is the next controller's to start: its
        admission is committed, and it finds no process for it."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._todo.put(None)
        if thread is not None:
            thread.join(CLOSE_WAIT)

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            uid, number, spawn = item
            if self._closed:
                self._settle(uid, None)
                continue
            try:
                outcome: Spawned | SpawnFailed = spawn()
            except Exception as exc:  # the step that asked handles it (see SpawnFailed)
                outcome = SpawnFailed(number, exc)
            self._settle(uid, outcome)

    def _settle(self, uid: str, outcome: Spawned | SpawnFailed | None) -> None:
        """The spawn is done (or will not happen: None); its job is woken if a step waits."""
        with self._lock:
            pending = self._pending.pop(uid, None)
            if outcome is not None:
                self._done[uid] = outcome
        if pending is not None and (pending.wanted or isinstance(outcome, SpawnFailed)):
            self._wake(pending.name, urgent=True)
