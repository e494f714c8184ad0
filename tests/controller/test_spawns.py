"""Spawns: runs started off the reconcile thread, each only once the batch that admitted it has
committed, never when that batch is lost; the job's step takes the outcome, and is woken
when it asked while the spawn was pending or when the spawn failed. A real store; the spawn
itself is a function here (tests/crash and tests/integration start real runs through it)."""

from __future__ import annotations

import threading

import pytest

from reconciler.agent.local import StartFailed
from reconciler.controller.spawns import PENDING, Spawned, SpawnFailed, Spawns
from reconciler.store import Store
from reconciler.store import repository as repo
from tests.helpers import wait_until


class Boom(Exception):
    pass


@pytest.fixture
def woken():
    return []


@pytest.fixture
def store_and_spawns(sqlite_url, woken):
    store = Store(sqlite_url)
    spawns = Spawns(store, lambda name, urgent=False: woken.append((name, urgent)))
    yield store, spawns
    spawns.close()
    store.dispose()


@pytest.fixture
def store(store_and_spawns):
    return store_and_spawns[0]


@pytest.fixture
def spawns(store_and_spawns):
    return store_and_spawns[1]


def _spawned(number: int, log: list[str], name: str):
    def spawn() -> Spawned:
        log.append(name)
        return Spawned(number, None, "2026-12-06T00:00:00Z", "here", 0.0)  # type: ignore[arg-type]

    return spawn


def _write(store: Store, name: str) -> None:
    with store.write(known=True) as tx:
        repo.create(tx, kind="Job", name=name, spec={"command": ["true"]}, labels={}, annotations={})


def test_a_spawn_asked_in_a_batch_starts_only_after_its_commit(store, spawns):
    started: list[str] = []
    with store.batch():
        _write(store, "a")  # the admission the spawn must not run ahead of
        spawns.ask("uid-a", "a", 1, _spawned(1, started, "a"))
        assert spawns.take("uid-a") is PENDING
        # another thread (no batch) asks for one now; spawns run in the order asked, so
        # once it has run, "a" would have too had it been asked of the thread before the commit
        asker = threading.Thread(target=spawns.ask, args=("uid-m", "m", 1, _spawned(1, started, "marker")))
        asker.start()
        asker.join(20)
        wait_until(lambda: started == ["marker"], message="the other thread's spawn")
    wait_until(lambda: started == ["marker", "a"], message="spawned after the commit")
    taken = wait_until(lambda: (t := spawns.take("uid-a")) is not PENDING and t)
    assert isinstance(taken, Spawned) and taken.number == 1
    assert spawns.take("uid-a") is None, "an outcome is taken once"


def test_a_spawn_asked_in_a_batch_that_is_lost_never_starts(store, spawns, woken):
    started: list[str] = []
    with pytest.raises(Boom), store.batch():
        _write(store, "a")
        spawns.ask("uid-a", "a", 1, _spawned(1, started, "a"))
        assert spawns.take("uid-a") is PENDING  # a step asked meanwhile: it is woken
        raise Boom
    assert spawns.take("uid-a") is None, "forgotten with the batch: the next step spawns again"
    assert woken == [("a", True)]
    # spawns run in the order asked: once a later one has run, the lost one would have too
    spawns.ask("uid-b", "b", 1, _spawned(1, started, "b"))
    wait_until(lambda: started == ["b"], message="the next spawn")
    assert started == ["b"]


def test_a_step_that_found_the_spawn_pending_is_woken_when_it_is_done(store, spawns, woken):
    gate = threading.Event()
    started: list[str] = []

    def slow() -> Spawned:
        gate.wait(20)
        return _spawned(3, started, "slow")()

    spawns.ask("uid-s", "slow", 3, slow)  # outside a batch: asked of the thread at once
    assert spawns.take("uid-s") is PENDING
    assert woken == []
    gate.set()
    wait_until(lambda: woken == [("slow", True)], message="the waiting step woken")
    taken = spawns.take("uid-s")
    assert isinstance(taken, Spawned) and taken.number == 3


def test_a_spawn_nobody_waits_for_wakes_nobody_and_a_failed_one_wakes_its_job(store, spawns, woken):
    started: list[str] = []
    spawns.ask("uid-ok", "ok", 1, _spawned(1, started, "ok"))

    def fails() -> Spawned:
        raise StartFailed("executable 'nope' not found in PATH")

    spawns.ask("uid-bad", "bad", 2, fails)
    wait_until(lambda: woken, message="the failed spawn's job woken")
    assert woken == [("bad", True)], "a run that started is woken by its exit, not by the spawn"
    failed = spawns.take("uid-bad")
    assert isinstance(failed, SpawnFailed) and failed.number == 2
    assert isinstance(failed.error, StartFailed)
    assert isinstance(spawns.take("uid-ok"), Spawned)


def test_a_closed_spawns_starts_nothing_more(store, woken):
    spawns = Spawns(store, lambda name, urgent=False: woken.append(name))
    entered, gate = threading.Event(), threading.Event()
    started: list[str] = []

    def first() -> Spawned:
        entered.set()
        gate.wait(20)
        return _spawned(1, started, "first")()

    spawns.ask("uid-1", "first", 1, first)
    spawns.ask("uid-2", "second", 1, _spawned(1, started, "second"))
    assert entered.wait(20), "the first spawn in progress"
    closing = threading.Thread(target=spawns.close)
    closing.start()
    wait_until(lambda: spawns._closed, message="closing")
    gate.set()  # the spawn in progress ends; the one behind it is not started
    closing.join(20)
    assert not closing.is_alive()
    assert started == ["first"]
    spawns.ask("uid-3", "third", 1, _spawned(1, started, "third"))
    assert spawns.take("uid-3") is None and started == ["first"]
