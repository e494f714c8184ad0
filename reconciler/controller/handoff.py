"""Writes another thread of this process hands to the reconcile worker, to be made in the
worker's batch: an agent's reports, which the server's route would otherwise write in a
transaction of its own, after waiting for the write lock the batch holds, and which the
change feed would then announce to the controller as another writer's. Handed, a report
is written in the transaction of the step that acts on it (a run's end and the job's
completion commit together), and the route answers once that commit is made.

The worker takes what was handed before each step (`take`), so a job's step that a hand
woke reads what was handed for it. A hand not taken within HAND_WAIT (the worker is busy
in a long step, or stopping) is withdrawn and the caller writes it itself; one taken is
waited for until its batch commits or rolls back. A write returns something other than None:
None is a hand's answer when the worker did not make it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from ..errors import Conflict
from ..store import Store
from ..store.transactions import Tx

HAND_WAIT = 2.0  # seconds a handed write may wait to be taken before its caller writes it itself

Write = Callable[[Tx], Any]


class _Handed:
    __slots__ = ("done", "error", "jobs", "result", "taken", "write")

    def __init__(self, write: Write, jobs: list[str]):
        self.write = write
        self.jobs = jobs
        self.taken = False
        self.done = threading.Event()
        self.result: Any = None
        self.error: Conflict | None = None  # the write's refusal, raised to the caller

    def finish(self, result: Any = None, error: Conflict | None = None) -> None:
        """The write's result once committed, or its Conflict; neither: it was not made."""
        self.result, self.error = result, error
        self.done.set()


class Handoff:
    def __init__(self, store: Store, wake: Callable[[list[str]], None], *, workers: int = 1):
        """`wake(jobs)`: queue the jobs a handed write concerns (urgent keys), so that a
        worker takes it, and the steps that act on it follow. With several `workers`, the
        jobs are woken again once the write commits: another worker's batch may have taken
        a job's step before this one wrote (and the change feed does not tell the
        controller of its own writes). One worker takes every write before every step."""
        self.store = store
        self._wake = wake
        self._workers = workers
        self._lock = threading.Lock()
        self._pending: list[_Handed] = []
        self._closed = False

    def hand(self, write: Write, jobs: list[str]) -> Any:
        """Have the worker make `write(tx)` in its batch and wake `jobs`; its result once
        committed, or None when the worker did not make it: the caller makes it itself.
        The write's Conflict is raised here, with nothing of it kept."""
        handed = _Handed(write, jobs)
        with self._lock:
            if self._closed:
                return None
            self._pending.append(handed)
        self._wake(jobs)  # after the append: the step a key leads to takes the write first
        if not handed.done.wait(HAND_WAIT):
            with self._lock:
                if not handed.taken:  # withdrawn: it will never be made here
                    self._pending.remove(handed)
                    return None
            handed.done.wait()  # taken: its batch commits or rolls back shortly
        if handed.error is not None:
            raise handed.error
        return handed.result

    def take(self) -> None:
        """In the worker, before a step: make every handed write in this thread's batch. A
        write refused (Conflict) refuses only its own hand; any other error leaves each hand
        not yet committed to its caller and is raised (the batch rolls back)."""
        if not self._pending:  # read without the lock: a hand appended meanwhile is taken by its key's step
            return
        with self._lock:
            taken, self._pending = self._pending, []
            for handed in taken:
                handed.taken = True
        for i, handed in enumerate(taken):
            try:
                with self.store.write(known=True) as tx:
                    result = handed.write(tx)
            except Conflict as exc:  # made before the write wrote anything: the batch is as it was
                handed.finish(error=exc)
                continue
            except BaseException:
                for left in taken[i:]:
                    left.finish()  # not made: their callers make them
                raise
            self.store.on_commit(partial(handed.finish, result), or_else=handed.finish)
            if self._workers > 1:
                self.store.after_commit(partial(self._wake, handed.jobs))

    def close(self) -> None:
        """No more hands: those not taken go back to their callers now."""
        with self._lock:
            self._closed = True
            left, self._pending = self._pending, []
        for handed in left:
            handed.finish()
