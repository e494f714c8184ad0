"""runtime.py: the work queue (dedup, per-key exclusivity, timers, close) and the Runner
(error backoff, requeue-after). Real threads and short real delays; every wait is a poll with a
deadline, and no assertion is about how fast anything ran."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import types
from collections.abc import Hashable

import pytest

from reconciler.controller import runtime
from reconciler.controller.runtime import Runner, WorkQueue
from tests.helpers import wait_until

DEADLINE = 10.0  # generous: only a broken queue ever gets near it


def get_within(queue: WorkQueue, timeout: float = DEADLINE) -> Hashable | None:
    """queue.get(), failing the test instead of hanging if nothing comes."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(queue.get()), daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        queue.close()  # release the blocked getter
        raise AssertionError(f"queue.get() returned nothing within {timeout}s")
    return box[0]


class BackgroundGet:
    """A getter blocked in another thread, so a test can act while it waits."""

    def __init__(self, queue: WorkQueue):
        self.queue, self.result, self.returned = queue, None, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.result = self.queue.get()
        self.returned.set()

    def wait(self, timeout: float = DEADLINE):
        if not self.returned.wait(timeout):
            self.queue.close()
            raise AssertionError(f"queue.get() returned nothing within {timeout}s")
        return self.result


# --- WorkQueue: deduplication and exclusivity ----------------------------------------------


def test_adding_a_queued_key_again_does_not_duplicate_it():
    q = WorkQueue()
    for key in ("a", "a", "b", "a", "b"):
        q.add(key)
    assert len(q) == 2
    assert [q.get(), q.get()] == ["a", "b"]
    assert len(q) == 0


def test_keys_come_out_in_the_order_they_were_added():
    q = WorkQueue()
    for key in ("c", "a", "b"):
        q.add(key)
    assert [q.get() for _ in range(3)] == ["c", "a", "b"]


def test_a_key_being_processed_is_not_handed_out_again():
    q = WorkQueue()
    q.add("a")
    assert q.get() == "a"
    q.add("a")  # changed again while being processed
    assert len(q) == 0
    q.add("b")
    assert q.get() == "b"  # other keys still flow
    assert len(q) == 0


def test_a_key_added_while_processing_is_queued_again_on_done():
    q = WorkQueue()
    q.add("a")
    assert q.get() == "a"
    q.add("a")
    q.add("a")
    q.add("a")
    q.done("a")
    assert len(q) == 1  # once, however often it was added meanwhile
    assert q.get() == "a"
    q.done("a")
    assert len(q) == 0 and q.idle()


def test_done_without_a_new_add_does_not_requeue():
    q = WorkQueue()
    q.add("a")
    assert q.get() == "a"
    q.done("a")
    assert len(q) == 0 and q.idle()


def test_a_waiting_getter_receives_the_key_once_it_is_done():
    q = WorkQueue()
    q.add("a")
    assert q.get() == "a"
    q.add("a")
    getter = BackgroundGet(q)
    assert not getter.returned.is_set() and len(q) == 0  # nothing to hand out yet
    q.done("a")
    assert getter.wait() == "a"


def test_idle_tracks_queued_and_processing_keys():
    q = WorkQueue()
    assert q.idle()
    q.add("a")
    assert not q.idle()
    q.get()
    assert not q.idle()  # processing
    q.done("a")
    assert q.idle()


# --- WorkQueue: the urgent lane ------------------------------------------------------------


def test_urgent_keys_are_handed_out_before_earlier_normal_keys():
    q = WorkQueue()
    for key in ("n1", "n2"):
        q.add(key)
    q.add("u1", urgent=True)
    q.add("u2", urgent=True)
    assert [q.get() for _ in range(4)] == ["u1", "u2", "n1", "n2"]  # each lane in its own order


def test_adding_a_queued_key_as_urgent_promotes_it_once():
    q = WorkQueue()
    for key in ("a", "b", "c"):
        q.add(key)
    q.add("c", urgent=True)
    assert len(q) == 3
    assert [q.get() for _ in range(3)] == ["c", "a", "b"]  # c is not handed out a second time
    assert len(q) == 0
    for key in ("a", "b", "c"):
        q.done(key)
    assert q.idle()


def test_a_normal_add_does_not_demote_an_urgent_key():
    q = WorkQueue()
    q.add("n")
    q.add("u", urgent=True)
    q.add("u")
    assert [q.get(), q.get()] == ["u", "n"]


def test_a_promoted_key_added_again_after_it_was_handed_out_comes_once():
    q = WorkQueue()
    q.add("k")
    q.add("other")
    q.add("k", urgent=True)
    assert q.get() == "k"
    q.done("k")
    q.add("k")  # its old place in the normal lane is stale, not a second entry
    assert len(q) == 2
    assert [q.get(), q.get()] == ["other", "k"]
    assert len(q) == 0


def test_a_key_made_urgent_while_processed_is_requeued_urgent():
    q = WorkQueue()
    q.add("k")
    assert q.get() == "k"
    q.add("k", urgent=True)
    q.add("n")
    q.done("k")
    assert [q.get(), q.get()] == ["k", "n"]


def test_a_stream_of_urgent_keys_lets_one_normal_key_through_every_few():
    q = WorkQueue()
    q.add("n1")
    q.add("n2")
    for i in range(10):
        q.add(f"u{i}", urgent=True)
    order = [q.get() for _ in range(12)]
    streak = runtime.URGENT_STREAK
    assert order.index("n1") == streak and order.index("n2") == 2 * streak + 1
    assert [k for k in order if k.startswith("u")] == [f"u{i}" for i in range(10)]


# --- WorkQueue: timers ---------------------------------------------------------------------


def test_add_after_with_no_delay_is_an_immediate_add():
    q = WorkQueue()
    q.add_after("a", 0)
    q.add_after("b", -1)
    assert len(q) == 2


def test_timers_fire_in_due_order_not_insertion_order():
    q = WorkQueue()
    q.add_after("late", 0.3)
    q.add_after("early", 0.05)
    q.add_after("middle", 0.15)
    assert len(q) == 0  # nothing is due yet
    assert [get_within(q) for _ in range(3)] == ["early", "middle", "late"]


def test_an_earlier_timer_supersedes_a_later_one():
    q = WorkQueue()
    q.add_after("k", 60)
    q.add_after("k", 0.05)
    assert get_within(q) == "k"  # well before the 60 s timer


def test_a_later_timer_does_not_postpone_an_earlier_one():
    q = WorkQueue()
    q.add_after("k", 0.05)
    q.add_after("k", 60)
    assert get_within(q) == "k"


def test_a_superseded_timer_does_not_fire_again():
    q = WorkQueue()
    q.add_after("k", 0.3)
    q.add_after("k", 0.05)
    assert get_within(q) == "k"
    q.done("k")
    q.add_after("marker", 0.6)  # due after the stale 0.3 s timer of k
    assert get_within(q) == "marker"  # k's stale timer was dropped, not delivered


def test_a_timer_set_again_replaces_the_earlier_one_even_a_sooner_one():
    q = WorkQueue()
    q.set_timer("k", 0.05)
    q.set_timer("k", 0.6)  # the latest reconcile's word: not before 0.6 s
    q.add_after("marker", 0.3)
    assert get_within(q) == "marker"
    q.done("marker")
    assert get_within(q) == "k"


def test_no_timer_asked_drops_the_one_pending():
    q = WorkQueue()
    q.set_timer("k", 0.05)
    q.set_timer("k", None)
    q.add_after("marker", 0.3)
    assert get_within(q) == "marker"  # past k's dropped timer
    q.done("marker")
    assert len(q) == 0 and q.idle()


def test_replaced_timers_do_not_pile_up_in_the_heap():
    q = WorkQueue()
    for n in range(5000):
        q.set_timer(f"k{n % 10}", 60 + n / 1000)
    assert len(q._timers) <= 2 * 10 + 1024  # compacted: ten live timers and bounded leftovers
    assert len(q._due) == 10


def test_a_timer_firing_while_the_key_is_processed_is_not_lost():
    q = WorkQueue()
    q.add("k")
    assert q.get() == "k"
    q.add_after("k", 0.05)
    q.add_after("marker", 0.3)
    # the marker comes out first: k's earlier timer fired meanwhile but k, being processed,
    # was held back instead of handed out twice
    assert get_within(q) == "marker"
    q.done("k")
    assert get_within(q) == "k"  # ...and delivered once it was done
    q.done("k")
    q.done("marker")
    assert q.idle() and len(q) == 0


# --- WorkQueue: close ----------------------------------------------------------------------


def test_close_unblocks_a_waiting_get():
    q = WorkQueue()
    getter = BackgroundGet(q)
    q.close()
    assert getter.wait() is None


def test_close_unblocks_a_get_waiting_for_a_timer():
    q = WorkQueue()
    q.add_after("k", 60)
    getter = BackgroundGet(q)
    q.close()
    assert getter.wait() is None


def test_get_after_close_returns_none_even_with_keys_queued():
    q = WorkQueue()
    q.add("a")
    q.close()
    assert get_within(q) is None


# --- Runner ----------------------------------------------------------------------------------


class RecordingQueue(WorkQueue):
    """A WorkQueue that remembers every timer the runner sets (a requeue or an error's retry)."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[tuple[Hashable, float]] = []

    def add_after(self, key: Hashable, delay: float) -> None:
        self.delays.append((key, delay))
        super().add_after(key, delay)

    def set_timer(self, key: Hashable, delay: float | None) -> None:
        if delay is not None:
            self.delays.append((key, delay))
        super().set_timer(key, delay)


class Script:
    """A reconciler playing a script: each call takes the next step (an exception to raise or a
    requeue delay to return); after the script, it returns None."""

    def __init__(self, *steps):
        self.steps = list(steps)
        self.calls: list[Hashable] = []
        self.lock = threading.Lock()

    def __call__(self, key: Hashable) -> runtime.Result:
        with self.lock:
            self.calls.append(key)
            step = self.steps.pop(0) if self.steps else None
        if isinstance(step, Exception):
            raise step
        if isinstance(step, runtime.Result):
            return step
        return runtime.requeue_after(step)


@pytest.fixture
def start_runner():
    runners: list[Runner] = []

    def start(queue: WorkQueue, reconcile, workers: int = 2) -> Runner:
        runner = Runner(queue, reconcile, workers=workers)
        runners.append(runner)
        runner.start()
        return runner

    yield start
    for runner in runners:
        runner.stop()


@pytest.fixture
def steady_random(monkeypatch):
    """Inject the runner's random source: a draw of 0.5 makes the error delay exactly base * 2**n."""
    monkeypatch.setattr(runtime, "random", types.SimpleNamespace(random=lambda: 0.5))


def _settled(queue: WorkQueue, script: Script, calls: int) -> bool:
    return len(script.calls) >= calls and queue.idle()


def test_runner_hands_every_key_to_the_reconciler(start_runner):
    q = RecordingQueue()
    jobs = Script()
    start_runner(q, jobs)
    for key in ("a", "w1", "b"):
        q.add(key)
    wait_until(lambda: len(jobs.calls) == 3 and q.idle(), timeout=DEADLINE)
    assert sorted(jobs.calls) == ["a", "b", "w1"]
    assert q.delays == []  # DONE means: do not call again until woken


def test_runner_calls_again_after_a_returned_requeue_delay(start_runner):
    q = RecordingQueue()
    script = Script(0.05, 0.02)  # two requeues, then done
    start_runner(q, script)
    q.add("k")
    wait_until(lambda: _settled(q, script, 3), timeout=DEADLINE, message="three reconciles")
    assert script.calls == ["k", "k", "k"]
    assert q.delays == [("k", 0.05), ("k", 0.02)]


def test_a_reconcile_asking_for_no_timer_cancels_the_one_an_earlier_reconcile_set(start_runner):
    q = RecordingQueue()
    script = Script(0.4, runtime.DONE)  # a timer, then woken early: nothing more to look at
    start_runner(q, script, workers=1)
    q.add("k")
    wait_until(lambda: _settled(q, script, 1), timeout=DEADLINE, message="the first reconcile")
    q.add("k")  # woken before its timer
    wait_until(lambda: _settled(q, script, 2), timeout=DEADLINE, message="the second reconcile")
    q.add_after("marker", 0.8)  # due well after k's cancelled 0.4 s timer
    wait_until(lambda: _settled(q, script, 3), timeout=DEADLINE, message="the marker")
    assert script.calls == ["k", "k", "marker"]


def test_runner_requeues_a_failing_reconcile_with_growing_delay(start_runner, steady_random):
    q = RecordingQueue()
    script = Script(*[RuntimeError(f"boom {i}") for i in range(5)])
    start_runner(q, script)
    q.add("k")
    wait_until(lambda: _settled(q, script, 6), timeout=DEADLINE, message="five failures then success")
    delays = [d for _, d in q.delays]
    assert delays == pytest.approx([runtime.ERROR_BASE * 2**n for n in range(1, 6)])
    assert all(later > earlier for earlier, later in itertools.pairwise(delays))


def test_runner_error_delay_is_capped(start_runner, steady_random, monkeypatch):
    monkeypatch.setattr(runtime, "ERROR_MAX", 0.02)
    q = RecordingQueue()
    script = Script(*[RuntimeError("boom") for _ in range(4)])
    start_runner(q, script)
    q.add("k")
    wait_until(lambda: _settled(q, script, 5), timeout=DEADLINE)
    assert [d for _, d in q.delays] == pytest.approx([0.01, 0.02, 0.02, 0.02])


def test_runner_error_delay_jitter_stays_within_half_to_one_and_a_half(start_runner):
    q = RecordingQueue()
    script = Script(*[RuntimeError("boom") for _ in range(4)])
    start_runner(q, script)
    q.add("k")
    wait_until(lambda: _settled(q, script, 5), timeout=DEADLINE)
    for n, (_, delay) in enumerate(q.delays, start=1):
        base = runtime.ERROR_BASE * 2**n
        assert 0.5 * base <= delay < 1.5 * base


def test_a_success_resets_the_error_backoff(start_runner, steady_random):
    q = RecordingQueue()
    script = Script(RuntimeError("1"), RuntimeError("2"), 0.01, RuntimeError("3"))
    start_runner(q, script)
    q.add("k")
    wait_until(lambda: _settled(q, script, 5), timeout=DEADLINE)
    assert [d for _, d in q.delays] == pytest.approx([0.01, 0.02, 0.01, 0.01])


def test_error_backoff_is_per_key(start_runner, steady_random):
    q = RecordingQueue()
    scripts = {"a": Script(RuntimeError("a1"), RuntimeError("a2")), "b": Script(RuntimeError("b1"))}
    start_runner(q, lambda key: scripts[key](key))
    q.add("a")
    wait_until(lambda: _settled(q, scripts["a"], 3), timeout=DEADLINE)
    q.add("b")
    wait_until(lambda: _settled(q, scripts["b"], 2), timeout=DEADLINE)
    assert [d for k, d in q.delays if k == "b"] == pytest.approx([0.01])  # b starts from the base


def test_a_terminal_error_is_not_retried(start_runner):
    q = RecordingQueue()
    script = Script(runtime.TerminalError("the stored spec does not validate"), 0.01)
    start_runner(q, script)
    q.add("k")
    wait_until(lambda: _settled(q, script, 1), timeout=DEADLINE)
    assert q.delays == []  # not retried: the key waits until something wakes it
    q.add("k")  # woken: it runs again, and the error backoff starts from scratch
    wait_until(lambda: _settled(q, script, 3), timeout=DEADLINE)
    assert script.calls == ["k", "k", "k"]
    assert q.delays == [("k", 0.01)]


def test_again_calls_the_reconciler_at_once(start_runner):
    q = RecordingQueue()
    script = Script(runtime.AGAIN, runtime.AGAIN)
    start_runner(q, script)
    q.add("k")
    wait_until(lambda: _settled(q, script, 3), timeout=DEADLINE)
    assert script.calls == ["k", "k", "k"]
    assert q.delays == []  # no timer: queued again straight away


def test_the_same_key_is_never_reconciled_twice_at_once(start_runner):
    q = WorkQueue()
    release, entered = threading.Event(), threading.Event()
    active = {"a": 0, "max": 0}
    calls = {"a": 0, "b": 0}
    lock = threading.Lock()

    def reconcile(key):
        with lock:
            calls[key] += 1
            if key == "a":
                active["a"] += 1
                active["max"] = max(active["max"], active["a"])
        try:
            if key == "a" and calls["a"] == 1:
                entered.set()
                assert release.wait(DEADLINE)
        finally:
            if key == "a":
                with lock:
                    active["a"] -= 1
        return runtime.DONE

    start_runner(q, reconcile, workers=4)
    q.add("a")
    assert entered.wait(DEADLINE)
    for _ in range(5):
        q.add("a")  # changes arrive while a is being reconciled
    q.add("b")
    wait_until(lambda: calls["b"] == 1, timeout=DEADLINE, message="other keys proceed meanwhile")
    assert calls["a"] == 1
    release.set()
    wait_until(lambda: calls["a"] == 2 and q.idle(), timeout=DEADLINE, message="a reconciled once more")
    assert active["max"] == 1
    assert calls == {"a": 2, "b": 1}


def test_stop_ends_the_workers(start_runner):
    before = set(threading.enumerate())
    runner = start_runner(WorkQueue(), Script(), workers=3)
    workers = [t for t in threading.enumerate() if t not in before]
    assert len(workers) == 3
    runner.stop()
    assert not any(t.is_alive() for t in workers)


def test_a_timer_past_any_wait_does_not_break_the_queue():
    """A reconciler may ask for a later call than threading can wait for (a job whose
    deadline is years away): the queue caps the timer instead of dying in Condition.wait
    (OverflowError), and keeps handing out other keys."""
    q = WorkQueue()
    q.add_after("far", 1e12)  # ~31,700 years
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(q.get()), daemon=True)
    worker.start()
    q.add("near")
    worker.join(DEADLINE)
    assert got == ["near"]
    assert q._due["far"] - time.monotonic() <= runtime.MAX_TIMER


# --- Runner with group commit (a real store) ---------------------------------------------


def test_keys_ready_together_are_reconciled_in_one_batch_and_done_after_its_commit(tmp_path, monkeypatch):
    from reconciler.store import Store
    from reconciler.store import repository as repo

    monkeypatch.setattr(runtime, "MAX_BATCH_AGE", DEADLINE)  # a slow machine must not end the batch early
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    names = ["a", "b", "c"]
    with store.write() as tx:
        for name in names:
            repo.create(tx, kind="Job", name=name, spec={"command": ["true"]}, labels={}, annotations={})
    seen_elsewhere: dict[str, int] = {}

    def committed_phases() -> int:
        box: list[int] = []

        def look() -> None:
            with store.read() as conn:
                box.append(sum(1 for n in names if (repo.get(conn, kind="Job", name=n).status or {}).get("phase")))

        thread = threading.Thread(target=look)
        thread.start()
        thread.join(DEADLINE)
        return box[0]

    def reconcile(key):
        with store.read() as conn:
            obj = repo.get(conn, kind="Job", name=key)
        with store.write(known=True) as tx:
            repo.update_object(tx, obj, status={"phase": "Done"})
        seen_elsewhere[key] = committed_phases()
        return runtime.DONE

    q = WorkQueue()
    for name in names:
        q.add(name)
    runner = Runner(q, reconcile, workers=1, batching=store)
    runner.start()
    try:
        wait_until(lambda: len(seen_elsewhere) == 3 and q.idle(), timeout=DEADLINE)
    finally:
        runner.stop()
    # each write was invisible to others until the batch's one commit, after the last key
    assert seen_elsewhere == {"a": 0, "b": 0, "c": 0}
    assert committed_phases() == 3
    store.dispose()


class LostBatch:
    """A store whose batches all fail to commit (the Batching protocol)."""

    def __init__(self) -> None:
        self.batches = 0

    @contextlib.contextmanager
    def batch(self):
        self.batches += 1
        yield types.SimpleNamespace(lost=True)

    def batch_age(self) -> float:
        return 0.0


def test_every_key_of_a_lost_batch_is_retried_and_the_reconciler_forgets(steady_random):
    q = RecordingQueue()
    for key in ("a", "b"):
        q.add(key)
    calls: list[str] = []
    forgotten: list[bool] = []
    lost = LostBatch()

    def reconcile(key):
        calls.append(key)
        return runtime.DONE

    runner = Runner(q, reconcile, workers=1, batching=lost, forget=lambda: forgotten.append(True))
    runner.start()
    try:
        wait_until(lambda: len(calls) >= 4, timeout=DEADLINE, message="both keys reconciled again")
    finally:
        runner.stop()
    assert calls[:2] == ["a", "b"] and sorted(calls[2:4]) == ["a", "b"]
    assert forgotten and {k for k, _ in q.delays} == {"a", "b"}  # retried as after an error


def test_a_lost_batch_names_the_error_that_rolled_it_back(steady_random):
    """Every key of a lost batch fails with one error, which carries the reconcile's own
    (message and cause), so the log says what went wrong, not only that a commit failed."""
    q = RecordingQueue()
    q.add("b")
    q.add("a")
    outcomes: list[tuple[str, object]] = []
    batch = types.SimpleNamespace(lost=False)

    class Batching:
        @contextlib.contextmanager
        def batch(self):
            yield batch

        def batch_age(self) -> float:
            return 0.0

    def reconcile(key):
        if key == "a" and not outcomes:
            batch.lost = True  # as a failed write marks the store's batch
            raise ValueError("bad SQL in a")
        return runtime.DONE

    class Watching(Runner):
        def _finish(self, key, outcome):
            outcomes.append((key, outcome))
            batch.lost = False
            super()._finish(key, outcome)

    runner = Watching(q, reconcile, workers=1, batching=Batching())
    runner.start()
    try:
        wait_until(lambda: len(outcomes) >= 2, timeout=DEADLINE, message="both keys finished")
    finally:
        runner.stop()
    assert [k for k, _ in outcomes[:2]] == ["b", "a"]  # one batch, b first
    for _, outcome in outcomes[:2]:
        assert isinstance(outcome, RuntimeError) and "bad SQL in a" in str(outcome)
        assert isinstance(outcome.__cause__, ValueError)


def test_keys_put_back_come_out_first_again_in_order_and_as_urgent_as_they_were():
    q = WorkQueue()
    q.add("normal")
    q.add("later")
    q.add("hot", urgent=True)
    taken = [q.get_nowait(), q.get_nowait()]
    assert taken == ["hot", "normal"]
    q.add("hotter", urgent=True)
    q.put_back(taken)
    assert [q.get_nowait() for _ in range(4)] == ["hot", "hotter", "normal", "later"]


class Aging:
    """Batching whose batches are old after `limit` keys (the Batching protocol)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.batches: list[list[str]] = []

    @contextlib.contextmanager
    def batch(self):
        self.batches.append([])
        yield types.SimpleNamespace(lost=False)

    def batch_age(self) -> float:
        return runtime.MAX_BATCH_AGE if len(self.batches[-1]) >= self.limit else 0.0


def test_a_batch_is_reconciled_in_the_order_asked_and_what_it_has_no_time_for_comes_next():
    q = WorkQueue()
    for key in ("a", "b", "c", "d"):
        q.add(key)
    aging = Aging(limit=2)
    calls: list[str] = []

    def reconcile(key):
        calls.append(key)
        aging.batches[-1].append(key)
        return runtime.DONE

    runner = Runner(q, reconcile, workers=1, batching=aging, order=lambda keys: sorted(keys, reverse=True))
    runner.start()
    try:
        wait_until(lambda: len(calls) == 4 and q.idle(), timeout=DEADLINE, message="every key reconciled")
    finally:
        runner.stop()
    # all four were ready together: d and c first (the order's), then the two put back
    assert aging.batches == [["d", "c"], ["b", "a"]]


def test_a_key_a_step_makes_ready_joins_the_batch_that_made_it():
    """A chain's next job, woken by the step that completed the one before, is reconciled in
    the same batch (its admission shares that transaction), not in a batch of its own."""
    q = WorkQueue()
    q.add("k0")
    aging = Aging(limit=100)
    calls: list[str] = []

    def reconcile(key):
        calls.append(key)
        aging.batches[-1].append(key)
        number = int(key[1:])
        if number < 19:
            q.add(f"k{number + 1}")  # as a completion wakes its dependent
        return runtime.DONE

    runner = Runner(q, reconcile, workers=1, batching=aging, order=lambda keys: keys)
    runner.start()
    try:
        wait_until(lambda: len(calls) == 20 and q.idle(), timeout=DEADLINE, message="the whole chain")
    finally:
        runner.stop()
    assert aging.batches == [[f"k{i}" for i in range(20)]]
