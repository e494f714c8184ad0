"""Writes handed to the reconcile worker (`Handoff`): made in the worker's batch, answered
only once that batch commits, refused alone on a Conflict, given back to their caller when
the batch rolls back, when the worker does not take them in time, or when it stops. A
real store (SQLite and PostgreSQL) and real threads: the caller blocks as a route does."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reconciler.controller import handoff as handoff_module
from reconciler.controller.handoff import Handoff
from reconciler.errors import Conflict
from reconciler.store import Store
from reconciler.store import repository as repo
from reconciler.store.transactions import Tx
from tests.helpers import wait_until


class BoomError(Exception):
    pass


@pytest.fixture
def store(store_url):
    s = Store(store_url)
    with s.write() as tx:
        repo.create(tx, kind="Job", name="j", spec={"command": ["true"]}, labels={}, annotations={}, status={})
    yield s
    s.dispose()


def _committed_phase(store: Store) -> str | None:
    """The job's phase as another thread sees it: what is committed."""
    found: list[str | None] = []

    def look() -> None:
        with store.read() as conn:
            obj = repo.get(conn, kind="Job", name="j")
            assert obj is not None
            found.append(obj.status.get("phase"))

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(10)
    return found[0]


def _writing(phase: str, answer: Any = "kept"):
    def write(tx: Tx) -> Any:
        obj = repo.get(tx.session, kind="Job", name="j")
        assert obj is not None
        repo.update_object(tx, obj, status={"phase": phase})
        return answer

    return write


def _refusing(tx: Tx) -> Any:
    raise Conflict("the agent does not serve the node")


class Caller:
    """A route's thread: hands a write and waits for its answer."""

    def __init__(self, handoff: Handoff, write, jobs: list[str]):
        self.answer: Any = "unanswered"
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(handoff, write, jobs), daemon=True)
        self._thread.start()

    def _run(self, handoff: Handoff, write, jobs: list[str]) -> None:
        try:
            self.answer = handoff.hand(write, jobs)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()


def _handoff(store: Store) -> tuple[Handoff, list[str]]:
    woken: list[str] = []
    return Handoff(store, wake=woken.extend), woken


def test_a_handed_write_is_made_in_the_workers_batch_and_answered_only_after_its_commit(store):
    handoff, woken = _handoff(store)
    caller = Caller(handoff, _writing("Reported"), ["j"])
    wait_until(lambda: woken == ["j"], timeout=10, message="the hand wakes the job it concerns")
    with store.batch():
        handoff.take()
        with store.read() as conn:  # the worker's next step reads it
            obj = repo.get(conn, kind="Job", name="j")
            assert obj is not None and obj.status.get("phase") == "Reported"
        assert _committed_phase(store) is None, "made outside the batch's transaction"
        assert not caller.done.wait(0.1), "answered before the batch committed"
    assert caller.done.wait(10) and caller.error is None
    assert caller.answer == "kept"
    assert _committed_phase(store) == "Reported"


def test_a_conflict_refuses_only_its_own_hand(store):
    handoff, woken = _handoff(store)
    refused = Caller(handoff, _refusing, ["j"])
    kept = Caller(handoff, _writing("Reported"), ["j"])
    wait_until(lambda: len(woken) == 2, timeout=10, message="both hands are pending")
    with store.batch():
        handoff.take()
    assert refused.done.wait(10) and kept.done.wait(10)
    assert isinstance(refused.error, Conflict)
    assert kept.error is None and kept.answer == "kept"
    assert _committed_phase(store) == "Reported"


def test_a_hand_whose_batch_rolls_back_goes_back_to_its_caller(store):
    handoff, woken = _handoff(store)
    caller = Caller(handoff, _writing("Reported"), ["j"])
    wait_until(lambda: woken == ["j"], timeout=10, message="the hand is pending")
    with pytest.raises(BoomError), store.batch():
        handoff.take()
        raise BoomError
    assert caller.done.wait(10) and caller.error is None
    assert caller.answer is None, "a write rolled back was answered as made"
    assert _committed_phase(store) is None


def test_a_write_that_fails_gives_back_every_hand_taken_with_it(store):
    handoff, woken = _handoff(store)
    first = Caller(handoff, _writing("Reported"), ["j"])
    wait_until(lambda: len(woken) == 1, timeout=10, message="the first hand is pending")

    def failing(tx: Tx) -> Any:
        raise BoomError

    second = Caller(handoff, failing, ["j"])
    third = Caller(handoff, _writing("Other"), ["j"])
    wait_until(lambda: len(woken) == 3, timeout=10, message="three hands are pending")
    with pytest.raises(BoomError), store.batch():
        handoff.take()
    for caller in (first, second, third):
        assert caller.done.wait(10) and caller.error is None
        assert caller.answer is None
    assert _committed_phase(store) is None


def test_a_hand_not_taken_in_time_is_withdrawn_and_never_made(store, monkeypatch):
    monkeypatch.setattr(handoff_module, "HAND_WAIT", 0.2)
    handoff, _ = _handoff(store)
    made: list[Tx] = []

    def write(tx: Tx) -> Any:
        made.append(tx)
        return "kept"

    caller = Caller(handoff, write, ["j"])
    assert caller.done.wait(10) and caller.answer is None
    with store.batch():
        handoff.take()
    assert made == [], "a withdrawn hand was made after its caller made it itself"


def test_a_stopping_worker_gives_back_what_it_has_not_taken_and_takes_nothing_more(store):
    handoff, woken = _handoff(store)
    caller = Caller(handoff, _writing("Reported"), ["j"])
    wait_until(lambda: woken == ["j"], timeout=10, message="the hand is pending")
    handoff.close()
    assert caller.done.wait(10) and caller.answer is None
    after = Caller(handoff, _writing("Reported"), ["k"])
    assert after.done.wait(10) and after.answer is None
    assert woken == ["j"], "a hand after close woke a job"
    assert _committed_phase(store) is None
