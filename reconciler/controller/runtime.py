"""The controller runtime: a work queue with deduplication, per-key exclusivity, timers and
per-key exponential backoff on errors, served by worker threads (controller-runtime's shape).

The contract is small: a reconciler takes a key (a job's name) and returns a `Result`:
when it wants to be called again (`requeue_after` seconds, or only when something wakes
the key), or at once (`again`). An exception is retried with per-key exponential backoff;
a `TerminalError` is not retried at all. Everything else is the runtime's business."""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from .. import telemetry
from ..threads import critical
from . import faults

log = logging.getLogger("reconciler.runtime")

Key = str  # a job's name


@dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile asks of the runtime next."""

    requeue_after: float | None = None  # seconds until it wants to be called again; None: only when woken
    again: bool = False  # call it again at once: there is more to do now


DONE = Result()
AGAIN = Result(again=True)


def requeue_after(seconds: float | None) -> Result:
    return DONE if seconds is None else Result(requeue_after=seconds)


class TerminalError(Exception):
    """A reconcile failed in a way retrying cannot fix (say, a stored spec that no longer
    validates): logged once, not retried; the key runs again only when something wakes it."""


Reconcile = Callable[[Key], Result]

ERROR_BASE, ERROR_MAX = 0.005, 30.0
# A timer further away than this is set for this long: the reconciler is called then and asks
# again. Keeps every wait far below threading.TIMEOUT_MAX, whatever a manifest asks for.
MAX_TIMER = 86400.0
URGENT_STREAK = 4  # urgent keys in a row before one normal key goes (the normal lane gets >= 1/5)
# A batch ends when this many keys were reconciled, or once its transaction (the store's write
# lock) is this old: other writers (a node agent's reports, apply) wait no longer than that.
MAX_BATCH = 64
MAX_BATCH_AGE = 0.010


class WorkQueue:
    """A key is queued at most once; a key being processed is never handed out again until
    `done`, and if it was added meanwhile it is queued again then (no lost wake-ups).

    Two lanes: urgent keys (a run ended, slots came free: work that starts or finishes a
    run) are handed out before the rest (status bookkeeping, timers, the initial list), so a
    free slot is not left idle behind a backlog; but one normal key goes after every
    URGENT_STREAK urgent ones. Adding a queued key as urgent promotes it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: deque[tuple[Key, int]] = deque()  # (key, entry number)
        self._urgent: deque[tuple[Key, int]] = deque()
        self._queued: dict[Key, tuple[bool, int]] = {}  # key -> (urgent, its live entry); others are stale
        self._processing: set[Key] = set()
        self._handed: dict[Key, bool] = {}  # key being processed -> whether it was urgent (put_back)
        self._dirty: dict[Key, bool] = {}
        self._streak = 0  # urgent keys handed out in a row
        self._timers: list[tuple[float, int, Key]] = []
        self._due: dict[Key, float] = {}  # earliest pending timer per key
        self._seq = 0
        self._closed = False

    def add(self, key: Key, urgent: bool = False) -> None:
        with self._cond:
            self._add_locked(key, urgent)

    def add_many(self, keys: list[Key], urgent: bool = False) -> None:
        """Keys that became ready together (one look at the change feed): a worker takes them
        all, or none of them, so it can order them (Runner's `order`)."""
        with self._cond:
            for key in keys:
                self._add_locked(key, urgent)

    def _add_locked(self, key: Key, urgent: bool = False) -> None:
        if key in self._processing:
            self._dirty[key] = self._dirty.get(key, False) or urgent
            return
        queued = self._queued.get(key)
        if queued is None or (urgent and not queued[0]):
            self._seq += 1
            self._queued[key] = (urgent, self._seq)
            (self._urgent if urgent else self._ready).append((key, self._seq))
            self._cond.notify()

    def add_after(self, key: Key, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        at = time.monotonic() + min(delay, MAX_TIMER)
        with self._cond:
            if self._due.get(key, float("inf")) <= at:
                return  # an earlier timer for this key will wake it anyway
            self._due[key] = at
            self._seq += 1
            heapq.heappush(self._timers, (at, self._seq, key))
            self._cond.notify()

    def set_timer(self, key: Key, delay: float | None) -> None:
        """The key's timer as its latest reconcile asks, replacing any set before (that
        reconcile saw an older state): in `delay` seconds, or none. A timer left from an
        earlier state would only cost a look at a job that no longer needs one."""
        if delay is not None and delay <= 0:
            self.add(key)
            delay = None
        with self._cond:
            if delay is None:
                self._due.pop(key, None)  # its heap entry is skipped when it comes up
            else:
                at = time.monotonic() + min(delay, MAX_TIMER)
                self._due[key] = at
                self._seq += 1
                heapq.heappush(self._timers, (at, self._seq, key))
                self._cond.notify()
            if len(self._timers) > 2 * len(self._due) + 1024:  # mostly replaced entries: drop them
                self._timers = [t for t in self._timers if self._due.get(t[2]) == t[0]]
                heapq.heapify(self._timers)

    def get(self) -> Key | None:
        """Next key to process, blocking; None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                ready = self._take_locked()
                if ready is not None:
                    return ready
                timeout = self._timers[0][0] - time.monotonic() if self._timers else None
                self._cond.wait(timeout)

    def get_nowait(self) -> Key | None:
        """The next key ready now (marked as processing, like `get`), or None."""
        with self._cond:
            return None if self._closed else self._take_locked()

    def _take_locked(self) -> Key | None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            at, _, key = heapq.heappop(self._timers)
            if self._due.get(key) == at:
                del self._due[key]
                self._add_locked(key)
        ready = self._pop()
        if ready is not None:
            self._processing.add(ready)
        return ready

    def _pop(self) -> Key | None:
        # after URGENT_STREAK urgent keys in a row, one normal key goes, if any waits: timers
        # and other processes' changes are never starved by a stream of short runs
        lanes = (self._ready, self._urgent) if self._streak >= URGENT_STREAK else (self._urgent, self._ready)
        for lane in lanes:
            while lane:
                key, entry = lane.popleft()
                if self._queued.get(key, (None, None))[1] == entry:  # else stale: promoted or handed out
                    urgent = self._queued.pop(key)[0]
                    self._streak = self._streak + 1 if urgent else 0
                    self._handed[key] = urgent
                    return key
        return None

    def done(self, key: Key) -> None:
        with self._cond:
            self._processing.discard(key)
            self._handed.pop(key, None)
            urgent = self._dirty.pop(key, None)
            if urgent is not None:
                self._add_locked(key, urgent)

    def put_back(self, keys: list[Key]) -> None:
        """Keys handed out and not processed: at the front of their lanes again, in this
        order, as urgent as when they were taken (or as added meanwhile)."""
        with self._cond:
            for key in reversed(keys):
                self._processing.discard(key)
                urgent = self._handed.pop(key, False) or bool(self._dirty.pop(key, False))
                self._seq += 1
                self._queued[key] = (urgent, self._seq)
                (self._urgent if urgent else self._ready).appendleft((key, self._seq))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return not self._queued and not self._processing

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued)


class Batching(Protocol):
    """Group commit (the store's `batch`): the steps of keys ready together share one write
    transaction. `lost` tells after the block whether a commit failed (the writes since the
    one before are gone)."""

    def batch(self) -> AbstractContextManager[Lost]: ...
    def batch_age(self) -> float: ...


class Lost(Protocol):
    @property
    def lost(self) -> bool: ...


Outcome = Result | Exception  # what one reconcile of a key came to


class Runner:
    """Workers pulling keys from one queue and handing them to the reconciler.

    With `batching`, a worker takes every key ready now (up to MAX_BATCH, while the batch's
    transaction is younger than MAX_BATCH_AGE) and reconciles them in one batch: their writes
    commit together, and only then are the keys marked done and requeued. If a commit of the
    batch failed, every key of it is retried as after an error, and `forget` drops what the
    reconciler remembered of the lost writes."""

    def __init__(
        self,
        queue: WorkQueue,
        reconcile: Reconcile,
        workers: int = 1,
        *,
        batching: Batching | None = None,
        forget: Callable[[], None] | None = None,
        order: Callable[[list[Key]], list[Key]] | None = None,
    ):
        self.queue = queue
        self._reconcile = reconcile
        self._batching = batching
        self._forget = forget
        self._order = order
        self._failures: dict[Key, int] = {}
        self._threads = [critical(f"reconcile-{i}", self._work) for i in range(workers)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.queue.close()
        for thread in self._threads:
            thread.join(timeout)

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            if self._batching is None:
                self._finish(key, self._run(key))
            else:
                self._batch(key, self._batching)

    def _batch(self, key: Key, batching: Batching) -> None:
        # The keys ready now go first, in the order the reconciler asks (jobs: by priority, so
        # that of jobs made eligible together the most urgent is admitted first); then, while
        # the batch is young, keys that became ready meanwhile (a job its steps woke: a chain's
        # next link joins the transaction that completed the one before). With several
        # workers, a worker takes no more than its share of what is ready. What the batch has
        # no time for goes back to the front of the queue.
        share = MAX_BATCH if len(self._threads) == 1 else max(1, len(self.queue) // len(self._threads))
        keys = [key]
        while len(keys) < share and (ready := self.queue.get_nowait()) is not None:
            keys.append(ready)
        outcomes: list[tuple[Key, Outcome]] = []
        lost: Exception | None = None
        try:
            with batching.batch() as batch:
                if self._order is not None and len(keys) > 1:
                    keys = self._ordered(keys, self._order)  # what it reads, it reads in the batch
                while True:
                    key = keys[len(outcomes)]
                    outcomes.append((key, self._run(key)))
                    if batch.lost or len(outcomes) >= MAX_BATCH or batching.batch_age() >= MAX_BATCH_AGE:
                        break
                    if len(outcomes) == len(keys):
                        if (ready := self.queue.get_nowait()) is None:
                            break
                        keys.append(ready)
            if batch.lost:
                # every key of the batch is retried; the error that rolled it back is named
                cause = next((o for _, o in outcomes if isinstance(o, Exception)), None)
                lost = RuntimeError("a commit of the batch failed" + (f": {cause}" if cause else ""))
                lost.__cause__ = cause
        except faults.InjectedFault:
            raise
        except Exception as exc:  # the batch's commit failed: its writes are gone
            lost = exc
        if lost is not None:
            if self._forget is not None:
                self._forget()  # before a key put back can be taken by another worker
            outcomes = [(k, lost) for k, _ in outcomes]
        if len(outcomes) < len(keys):
            self.queue.put_back(keys[len(outcomes) :])
        for done, outcome in outcomes:
            self._finish(done, outcome)

    @staticmethod
    def _ordered(keys: list[Key], order: Callable[[list[Key]], list[Key]]) -> list[Key]:
        try:
            ordered = order(keys)
        except Exception:  # e.g. the store is briefly unavailable: the order taken stands
            log.warning("ordering %d keys failed; taken as they came", len(keys), exc_info=True)
            return keys
        if sorted(ordered) != sorted(keys):  # a bug of the order's: never lose or repeat a key
            log.error("an order of %d keys changed the keys; taken as they came", len(keys))
            return keys
        return ordered

    def _run(self, key: Key) -> Outcome:
        faults.point("worker-dies")
        began = time.perf_counter()
        try:
            result = self._reconcile(key)
        except Exception as exc:  # the runner, not reconcilers, owns retrying on errors
            return exc
        telemetry.RECONCILE.observe(time.perf_counter() - began)
        return result

    def _finish(self, key: Key, outcome: Outcome) -> None:
        """Mark the key done and requeue it as its outcome asks."""
        if isinstance(outcome, TerminalError):
            log.error("reconcile %s failed for good: %s", key, outcome)
            self._failures.pop(key, None)
            self.queue.done(key)
            return
        if isinstance(outcome, Exception):
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = min(ERROR_MAX, ERROR_BASE * 2**failures) * (0.5 + random.random())
            level = logging.WARNING if failures > 3 else logging.DEBUG
            log.log(
                level,
                "reconcile %s failed (%s: %s); retrying in %.3fs",
                key,
                type(outcome).__name__,
                outcome,
                delay,
                exc_info=outcome if failures > 3 else None,
            )
            self.queue.done(key)
            self.queue.add_after(key, delay)
            return
        self._failures.pop(key, None)
        self.queue.done(key)
        if outcome.again:
            self.queue.add(key)
        else:
            self.queue.set_timer(key, outcome.requeue_after)
