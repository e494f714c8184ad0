"""Source ingestion beside the reconcile loop: a lane (a thread) per Source consumes its queue,
stores each batch of messages as jobs (intake.py, one transaction) and only then settles them
with the queue: acknowledged when stored (or already stored: a redelivery), rejected when not
a valid job. Nothing of it runs in a reconcile step, and the jobs it stores reach the loop
through the change feed like any other process's writes.

A queue that cannot be reached, or goes away, sets the Source's status (connected: false, the
error) and is tried again after 1s, doubling to at most 30s; the messages it held unsettled
go back to the queue with the broken connection, so none is lost and none was acknowledged
before its job was stored."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..api.source import SourceSpec
from ..store import Store
from ..store import repository as repo
from ..threads import critical
from . import faults
from .intake import Intake, Settled, note_connection
from .messages import Draft, Drafter
from .queues import Consumer, QueueError, consumer

log = logging.getLogger("reconciler.ingest")

LOOK = 1.0  # how often the Sources are listed: a new, changed or deleted one is acted on within it
POLL = 0.5  # a lane's longest wait for a message: how soon it sees that it must stop
FORGET_EVERY = 3600.0  # seconds between forgetting message ids older than intake.REMEMBER
FIRST_RETRY = 1.0
MAX_RETRY = 30.0


def retry_delay(failures: int) -> float:
    """After the n-th failure in a row to reach the queue: 1s, 2s, 4s ... at most 30s."""
    return min(MAX_RETRY, FIRST_RETRY * 2.0 ** min(failures - 1, 30))


@functools.lru_cache(maxsize=64)
def _spec(text: str) -> SourceSpec:
    return SourceSpec.model_validate(json.loads(text))


@dataclass(frozen=True)
class Wanted:
    """A Source as the lanes' manager sees it: a change of either starts its lane anew."""

    name: str
    uid: str
    spec_text: str


class Lane:
    """One Source's consumer loop, run by its own thread until `stop`."""

    def __init__(self, store: Store, wanted: Wanted, settled: Settled | None = None):
        self.store = store
        self.wanted = wanted
        self.spec = _spec(wanted.spec_text)
        self.intake = Intake(store, wanted.name, wanted.uid, settled)
        # a message's relative workingDir resolves where the controller runs (asked once)
        self.drafter = Drafter(self.spec.template, Path.cwd())
        self.stopping = threading.Event()
        self.say_stopped = False  # on stop, say the queue is no longer consumed (not when a new lane takes over)
        self._noted: tuple[bool, str | None] | None = None
        self._forget_at = 0.0  # when to forget old message ids next (monotonic): at once, then hourly

    def stop(self, *, say_stopped: bool) -> None:
        self.say_stopped = say_stopped
        self.stopping.set()

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            inbox = consumer(self.spec, self.wanted.name, self.stopping)
            error = None
            try:
                inbox.connect()
                if not self._consume(inbox):
                    return  # the Source is gone: its lane ends
            except QueueError as exc:
                error = str(exc)
            except Exception as exc:  # the store, or a bug: the queue keeps what was not settled
                log.warning("source %s: ingestion failed", self.wanted.name, exc_info=True)
                error = f"{inbox.where}: {type(exc).__name__}: {exc}"
            finally:
                inbox.close()  # what was not settled goes back to the queue
            if error is None:
                break
            if self.stopping.is_set():
                break  # replaced or deleted: the failure is no longer this Source's news
            failures += 1
            log.info("source %s: %s (retry %d)", self.wanted.name, error, failures)
            self._note(False, error)
            self.stopping.wait(retry_delay(failures))
        if self.say_stopped:
            self._note(False, None)

    def _consume(self, inbox: Consumer) -> bool:
        """Fetch, store, then settle, batch after batch; False when the Source is gone
        (nothing settled: the messages go back to the queue when the lane closes it)."""
        while not self.stopping.is_set():
            if time.monotonic() >= self._forget_at:
                self.intake.forget(time.time())
                self._forget_at = time.monotonic() + FORGET_EVERY
            messages = inbox.fetch(POLL)
            self._note(True, None)
            if not messages:
                continue
            verdicts = self.intake.store_batch(
                [(m, self.drafter.draft(m.body) if m.problem is None else Draft(problem=m.problem)) for m in messages]
            )
            if verdicts is None:
                return False
            faults.point("after-ingest")  # stored, not acknowledged: the crash test's point
            inbox.settle(verdicts)
        return True

    def _note(self, connected: bool, error: str | None) -> None:
        if self._noted == (connected, error):
            return
        try:
            wanted = self.wanted
            note_connection(self.store, wanted.name, wanted.uid, wanted.spec_text, connected=connected, error=error)
            self._noted = (connected, error)
        except Exception:  # the store is down too: said when it is back
            log.warning("source %s: status not written", self.wanted.name, exc_info=True)


class Ingester:
    """The lanes: one thread per Source, started when it is seen, started anew when its spec
    changes (or it is deleted and made again), ended when it is deleted. `settled` is told
    of the jobs stored at rest (Intake)."""

    def __init__(self, store: Store, settled: Settled | None = None):
        self.store = store
        self.settled = settled
        self._stop = threading.Event()
        self._lanes: dict[str, tuple[Lane, threading.Thread]] = {}
        self._refused: dict[str, str] = {}  # Source -> the stored spec text that did not validate
        self._thread = critical("source-lanes", self._run)

    def start(self) -> Ingester:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        lanes = list(self._lanes.values())
        for lane, _ in lanes:
            lane.stop(say_stopped=True)
        for _, thread in lanes:
            thread.join(2)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.store.read() as session:
                    wanted = {
                        o.name: Wanted(o.name, o.uid, o.spec_text) for o in repo.list_objects(session, kind="Source")
                    }
            except Exception:  # the store may be briefly unavailable
                log.warning("source lanes: listing sources failed", exc_info=True)
                wanted = None
            if wanted is not None and not self._stop.is_set():
                self._steer(wanted)
            self._stop.wait(LOOK)

    def _refuse(self, want: Wanted, exc: ValueError) -> None:
        """Say once, in the Source's status, that its stored spec no longer validates (it was
        stored by an earlier version with looser rules): the other Sources are consumed, and
        applying it again, corrected, starts its lane."""
        if self._refused.get(want.name) == want.spec_text:
            return
        self._refused[want.name] = want.spec_text
        error = f"its stored spec does not validate; apply it again, corrected: {exc}"
        log.warning("source %s: %s", want.name, error)
        try:
            note_connection(self.store, want.name, want.uid, want.spec_text, connected=False, error=error)
        except Exception:
            log.warning("source %s: status not written", want.name, exc_info=True)

    def _steer(self, wanted: dict[str, Wanted]) -> None:
        for name, (lane, thread) in list(self._lanes.items()):
            if wanted.get(name) != lane.wanted or not thread.is_alive():
                lane.stop(say_stopped=False)
                del self._lanes[name]
        for name, want in wanted.items():
            if name not in self._lanes:
                try:
                    lane = Lane(self.store, want, self.settled)
                except ValueError as exc:  # stored by a version with looser rules: this one is not consumed
                    self._refuse(want, exc)
                    continue
                thread = threading.Thread(target=lane.run, name=f"source-{name}", daemon=True)
                self._lanes[name] = (lane, thread)
                thread.start()
