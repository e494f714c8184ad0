"""Group commit (`Store.batch`): the controller's writes of one batch share a transaction,
each still all or nothing; its thread reads them before they commit; what acts on them waits
for the commit. On SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import threading

import pytest

from reconciler.errors import Conflict
from reconciler.store import Store
from reconciler.store import repository as repo
from reconciler.store.dbapi import Statement, StoreError

SPEC = {"command": ["true"]}


class BoomError(Exception):
    pass


@pytest.fixture
def store(store_url):
    s = Store(store_url)
    yield s
    s.dispose()


def _create(store: Store, name: str):
    with store.write() as tx:
        return repo.create(tx, kind="Job", name=name, spec=SPEC, labels={}, annotations={}, status={"phase": "Waiting"})


def _phase_elsewhere(store: Store, name: str) -> str | None:
    """The job's phase as another thread (its own connection) sees it: what is committed."""
    found: list[str | None] = []

    def look() -> None:
        with store.read() as conn:
            obj = repo.get(conn, kind="Job", name=name)
            found.append(None if obj is None else obj.status.get("phase"))

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(10)
    return found[0]


def _set_phase(store: Store, obj, phase: str):
    with store.write(known=True) as tx:
        return repo.update_object(tx, obj, status={"phase": phase})


def _set_phase_elsewhere(store: Store, name: str, phase: str) -> None:
    """Another thread of the process writes the job, as a verb or an agent's report would."""

    def write() -> None:
        with store.write() as tx:
            obj = repo.get(tx.session, kind="Job", name=name)
            repo.update_object(tx, obj, status={"phase": phase})

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(10)
    assert _phase_elsewhere(store, name) == phase


def _beat(store: Store) -> None:
    """A node's heartbeat, as its writers mark it: epoch-safe."""
    with store.write(epoch_safe=True) as tx:
        repo.create(tx, kind="Node", name=f"n{store.change_seq()}", spec={}, labels={}, annotations={})


def _read(store: Store, name: str):
    with store.read() as conn:
        return repo.get(conn, kind="Job", name=name)


def test_the_writes_of_a_batch_commit_together_and_its_thread_reads_them_first(store):
    a, b = _create(store, "a"), _create(store, "b")
    seq = store.change_seq()
    with store.batch() as batch:
        _set_phase(store, a, "Queued")
        with store.read() as conn:  # this thread sees its own write at once
            assert repo.get(conn, kind="Job", name="a").status["phase"] == "Queued"
        assert _phase_elsewhere(store, "a") == "Waiting"  # nobody else does before the commit
        _set_phase(store, b, "Queued")
        assert store.in_batch()
    assert not batch.lost and not store.in_batch()
    assert _phase_elsewhere(store, "a") == _phase_elsewhere(store, "b") == "Queued"
    assert store.change_seq() == seq + 1  # one transaction: one resourceVersion
    assert store.known_writes >= {seq + 1}


def test_a_conflict_in_a_batch_leaves_the_batch_as_it_was(store):
    a, b = _create(store, "a"), _create(store, "b")
    with store.batch() as batch:
        fresh = _set_phase(store, a, "Queued")
        with pytest.raises(Conflict):  # a stale write: its compare-and-swap wrote nothing
            _set_phase(store, a, "Running")
        _set_phase(store, fresh, "Starting")  # the batch goes on
        _set_phase(store, b, "Queued")
    assert not batch.lost
    assert _phase_elsewhere(store, "a") == "Starting"
    assert _phase_elsewhere(store, "b") == "Queued"


def test_any_other_exception_in_a_write_rolls_back_the_batch_since_its_last_flush(store):
    a, b, c = _create(store, "a"), _create(store, "b"), _create(store, "c")
    with store.batch() as batch:
        _set_phase(store, a, "Queued")
        store.flush()
        _set_phase(store, b, "Queued")
        with pytest.raises(BoomError), store.write(known=True) as tx:
            repo.update_object(tx, c, status={"phase": "Running"})
            raise BoomError
        assert batch.lost and not store.in_batch()
    assert _phase_elsewhere(store, "a") == "Queued"  # committed before
    assert _phase_elsewhere(store, "b") == _phase_elsewhere(store, "c") == "Waiting"


def test_an_exception_in_a_read_of_a_batch_does_not_lose_it(store):
    a = _create(store, "a")
    with store.batch() as batch:
        _set_phase(store, a, "Queued")
        with pytest.raises(BoomError), store.read():
            raise BoomError  # say, a stored spec that no longer validates: nothing was written
    assert not batch.lost
    assert _phase_elsewhere(store, "a") == "Queued"


def test_what_waits_for_a_commit_runs_after_it_and_flush_commits_midway(store):
    a, b = _create(store, "a"), _create(store, "b")
    seen: list[str | None] = []
    with store.batch():
        store.after_commit(lambda: seen.append("no write yet: at once"))
        assert seen == ["no write yet: at once"]
        _set_phase(store, a, "Queued")
        store.after_commit(lambda: seen.append(_phase_elsewhere(store, "a")))
        assert seen == ["no write yet: at once"]
        store.flush()  # what a spawn asks for: the admission committed before the process exists
        assert seen == ["no write yet: at once", "Queued"]
        assert not store.in_batch()
        _set_phase(store, b, "Queued")
        assert _phase_elsewhere(store, "b") == "Waiting"
    assert _phase_elsewhere(store, "b") == "Queued"


def test_what_only_a_commit_may_lead_to_runs_after_it_and_never_after_a_rollback(store):
    """on_commit (a run folder's removal): after the commit, as after_commit; but dropped
    with writes rolled back, where after_commit's wake-ups still run."""
    a, b, c = _create(store, "a"), _create(store, "b"), _create(store, "c")
    seen: list[str] = []
    with store.batch():
        a = _set_phase(store, a, "Queued")
        store.on_commit(lambda: seen.append("a committed"))
        assert seen == []
    assert seen == ["a committed"]
    with store.batch() as batch:
        _set_phase(store, b, "Queued")
        store.on_commit(lambda: seen.append("b committed"))
        store.after_commit(lambda: seen.append("woken"))
        with pytest.raises(BoomError), store.write(known=True) as tx:
            repo.update_object(tx, c, status={"phase": "Running"})
            raise BoomError
        assert batch.lost
        _set_phase(store, a, "Running")  # the batch goes on, and commits this
    assert seen == ["a committed", "woken"], "the rolled-back write's action ran"
    assert _phase_elsewhere(store, "b") == "Waiting"


def test_what_a_commit_would_have_led_to_is_undone_instead_when_the_writes_are_lost(store):
    """on_commit's or_else (a spawn asked for, which will not happen): run in place of the
    action when the writes are rolled back, or when the batch ends on an exception; not
    when they commit."""
    a, b, c = _create(store, "a"), _create(store, "b"), _create(store, "c")
    seen: list[str] = []
    with store.batch():
        a = _set_phase(store, a, "Queued")
        store.on_commit(lambda: seen.append("a spawned"), or_else=lambda: seen.append("a undone"))
    assert seen == ["a spawned"]
    with store.batch():
        _set_phase(store, b, "Queued")
        store.on_commit(lambda: seen.append("b spawned"), or_else=lambda: seen.append("b undone"))
        with pytest.raises(BoomError), store.write(known=True) as tx:
            repo.update_object(tx, c, status={"phase": "Running"})
            raise BoomError
        assert seen == ["a spawned", "b undone"]  # at the rollback, not later
    with pytest.raises(BoomError), store.batch():
        _set_phase(store, b, "Queued")
        store.on_commit(lambda: seen.append("b spawned"), or_else=lambda: seen.append("b undone again"))
        raise BoomError
    assert seen == ["a spawned", "b undone", "b undone again"]
    assert _phase_elsewhere(store, "b") == "Waiting"


def test_an_action_that_raises_keeps_none_after_it_from_running(store):
    """A wake-up or a spawn registered after an action that fails still happens (on commit,
    and in place of it when the writes are lost); the first error is raised after them."""
    a, b = _create(store, "a"), _create(store, "b")
    seen: list[str] = []

    def fails() -> None:
        seen.append("failed")
        raise BoomError

    with pytest.raises(BoomError), store.batch():
        _set_phase(store, a, "Queued")
        store.after_commit(fails)
        store.on_commit(lambda: seen.append("spawned"), or_else=lambda: seen.append("undone"))
        store.after_commit(lambda: seen.append("woken"))
    assert seen == ["failed", "woken", "spawned"]
    assert _phase_elsewhere(store, "a") == "Queued"
    seen.clear()
    with pytest.raises(BoomError), store.batch():
        _set_phase(store, b, "Queued")
        store.on_commit(fails, or_else=fails)
        store.on_commit(lambda: seen.append("spawned"), or_else=lambda: seen.append("undone"))
        raise KeyError("the batch ends on an error")
    assert seen == ["failed", "undone"]


def test_an_exception_out_of_a_batch_rolls_back_what_it_had_not_committed(store):
    a, b = _create(store, "a"), _create(store, "b")
    with pytest.raises(BoomError), store.batch() as batch:
        _set_phase(store, a, "Queued")
        store.flush()
        _set_phase(store, b, "Queued")
        raise BoomError
    assert batch.lost
    assert _phase_elsewhere(store, "a") == "Queued"
    assert _phase_elsewhere(store, "b") == "Waiting"
    _set_phase(store, b, "Running")  # the write lock was given back
    assert _phase_elsewhere(store, "b") == "Running"


def test_a_write_of_another_kind_in_a_batch_commits_the_batch_first(store):
    a = _create(store, "a")
    with store.batch():
        _set_phase(store, a, "Queued")
        _create(store, "b")  # not a controller write (known=False): a transaction of its own
        assert _phase_elsewhere(store, "a") == "Queued"
        assert _phase_elsewhere(store, "b") == "Waiting"


def test_a_commit_that_fails_marks_the_batch_lost_and_gives_the_lock_back(pg_url):
    """PostgreSQL: a deferred constraint fails only at COMMIT (SQLite has no such check)."""
    store = Store(pg_url)
    try:
        a = _create(store, "a")
        with pytest.raises(StoreError), store.batch() as batch:
            with store.write(known=True) as tx:
                repo.update_object(tx, a, status={"phase": "Queued"})
                Statement("CREATE TEMP TABLE t (x int UNIQUE DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP").execute(
                    tx.session
                )
                Statement("INSERT INTO t VALUES (1), (1)").execute(tx.session)
            store.flush()
        assert batch.lost
        assert _phase_elsewhere(store, "a") == "Waiting"
        _set_phase(store, a, "Running")
        assert _phase_elsewhere(store, "a") == "Running"
    finally:
        store.dispose()


def test_a_commit_that_fails_undoes_what_only_it_would_have_led_to(pg_url):
    """PostgreSQL, a deferred constraint failing at COMMIT: on_commit's action never runs,
    its or_else does."""
    store = Store(pg_url)
    seen: list[str] = []
    try:
        a = _create(store, "a")
        with pytest.raises(StoreError), store.batch():
            with store.write(known=True) as tx:
                repo.update_object(tx, a, status={"phase": "Queued"})
                Statement("CREATE TEMP TABLE t (x int UNIQUE DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP").execute(
                    tx.session
                )
                Statement("INSERT INTO t VALUES (1), (1)").execute(tx.session)
            store.on_commit(lambda: seen.append("spawned"), or_else=lambda: seen.append("undone"))
            store.flush()
        assert seen == ["undone"]
    finally:
        store.dispose()


def test_a_batch_epoch_lasts_until_another_writer_commits(store):
    """`Store.epoch` is what the controller compares to know that a job it read or wrote is
    still as stored: the same while the batch's transaction is open and across this thread's
    next ones while no other writer commits between them; another once one has, or once a
    batch's writes were rolled back; none outside a batch."""
    a = _create(store, "a")
    assert store.epoch() is None
    with store.batch():
        assert store.epoch(open=False) is None  # nothing opened, nothing committed yet
        first = store.epoch()  # opens the batch's transaction
        assert first is not None and store.in_batch()
        with store.read() as conn:
            repo.get(conn, kind="Job", name="a")
        a = _set_phase(store, a, "Queued")
        assert store.epoch() is first  # reads and writes of the batch share it
        store.flush()
        assert store.epoch(open=False) is first  # committed: the next transaction may continue it
        assert store.epoch() is first  # nobody else wrote: it does
        a = _set_phase(store, a, "Starting")
    with store.batch():
        assert store.epoch() is first  # a batch after the last one, with nothing between
    _set_phase_elsewhere(store, "a", "Running")  # another writer commits (its own connection)
    with store.batch():
        second = store.epoch()
        assert second not in (None, first)
        a = _read(store, "a")
    with pytest.raises(BoomError), store.batch():
        assert store.epoch() is second
        _set_phase(store, a, "Stopping")
        raise BoomError  # rolled back: what the batch wrote is not stored
    with store.batch():
        assert store.epoch() not in (None, second)
    with store.write() as tx:
        assert tx is not None and store.epoch() is None  # a write outside a batch is not one


def test_an_epoch_outlives_this_process_s_epoch_safe_commits_and_they_write_no_job(store):
    """A node's heartbeat or an agent's report (`write(epoch_safe=True)`) changes no job and
    no notifier: a batch epoch outlives it, as it does not another writer's commit. Such a
    transaction refuses to write a Job."""

    def elsewhere() -> None:
        thread = threading.Thread(target=_beat, args=(store,))
        thread.start()
        thread.join(10)

    a = _create(store, "a")
    with store.batch():
        first = store.epoch()
        _set_phase(store, a, "Queued")
    elsewhere()
    elsewhere()
    with store.batch():
        assert store.epoch() is first  # two epoch-safe commits came between: it goes on
    _set_phase_elsewhere(store, "a", "Running")
    with store.batch():
        assert store.epoch() not in (None, first)
    seq = store.change_seq()
    with pytest.raises(StoreError, match="epoch-safe"), store.write(epoch_safe=True) as tx:
        repo.update_object(tx, _read(store, "a"), status={"phase": "Stopping"})
    assert store.change_seq() == seq and _phase_elsewhere(store, "a") == "Running"


def test_a_batch_on_postgresql_pipelines_and_still_answers_row_counts(pg_url):
    """A batch's statements are pipelined on PostgreSQL: a write's row count, when asked, is
    the statement's own; a statement that failed is raised by the next one whose answer is
    read, and the batch is rolled back."""
    store = Store(pg_url)
    try:
        a = _create(store, "a")
        with store.batch() as batch, store.write(known=True) as tx:
            assert tx.session.pipelined
            touch = Statement("UPDATE objects SET labels = '{}' WHERE kind = 'Job' AND name = :n")
            assert touch.execute(tx.session, {"n": "a"}).rowcount == 1
            assert touch.execute(tx.session, {"n": "nobody"}).rowcount == 0
        assert not batch.lost
        with pytest.raises(StoreError, match="duplicate key"), store.batch() as batch:
            _set_phase(store, a, "Queued")
            with store.write(known=True) as tx:
                Statement("INSERT INTO meta (key, value) VALUES ('seq', 0)").execute(tx.session)  # not waited for
            with store.read() as conn:
                repo.get(conn, kind="Job", name="a")  # the next answer read: the failure comes here
        assert batch.lost
        assert _phase_elsewhere(store, "a") == "Waiting"
        with pytest.raises(StoreError, match="duplicate key"), store.batch() as batch:
            _set_phase(store, a, "Queued")
            with store.write(known=True) as tx:  # the batch's last statement: its failure comes at commit
                Statement("INSERT INTO meta (key, value) VALUES ('seq', 0)").execute(tx.session)
        assert batch.lost
        assert _phase_elsewhere(store, "a") == "Waiting"
        _set_phase(store, a, "Running")  # the store goes on
        assert _phase_elsewhere(store, "a") == "Running"
    finally:
        store.dispose()


def test_a_certain_swap_that_changes_no_row_loses_the_batch(store):
    """`update_object(certain=True)` is for a job read or written in the thread's batch epoch,
    which no other writer has come between. Told wrongly (the object is stale), nothing of the
    batch is committed, not even what it wrote before the swap: on PostgreSQL the server fails
    the pipelined swap and the commit after it; on SQLite the swap raises at once."""
    a = _create(store, "a")
    fresh = _set_phase(store, a, "Queued")  # `a` is stale from here
    b = _create(store, "b")
    with pytest.raises(StoreError, match="under the write lock changed 0 rows"), store.batch() as batch:
        with store.write(known=True) as tx:
            repo.update_object(tx, b, status={"phase": "Queued"}, certain=True)
        with store.write(known=True) as tx:
            repo.update_object(tx, a, status={"phase": "Running"}, certain=True)  # PostgreSQL: not waited for
        store.flush()
    assert batch.lost
    assert _phase_elsewhere(store, "a") == fresh.status["phase"] == "Queued"
    assert _phase_elsewhere(store, "b") == "Waiting"


def test_a_batch_whose_transaction_only_read_loses_nothing_when_a_read_fails(store):
    """A read that fails rolls the batch's transaction back; if nothing was written in it,
    nothing is lost (the runner then retries only the step that read, not the whole batch)."""
    _create(store, "a")
    with store.batch() as batch:
        with pytest.raises(StoreError), store.read() as conn:
            Statement("SELECT no_such_column FROM objects").execute(conn).all()
        assert not batch.lost and not store.in_batch()
        with store.read() as conn:  # a new transaction opens for what follows
            assert repo.get(conn, kind="Job", name="a") is not None
    assert not batch.lost


def test_each_transaction_of_a_batch_takes_the_next_resource_version_and_the_sequence_follows(store):
    """On PostgreSQL the lock reads the change sequence, so a transaction's resourceVersion is
    known without asking and its write is pipelined; on both stores each transaction takes the
    next one, and the sequence stored is the last one taken."""
    a = _create(store, "a")
    seq = store.change_seq()
    with store.batch():
        first = _set_phase(store, a, "Queued")
        store.flush()
        second = _set_phase(store, first, "Starting")
    assert (first.resource_version, second.resource_version) == (seq + 1, seq + 2)
    assert store.change_seq() == seq + 2
    with store.read() as conn:
        assert repo.get(conn, kind="Job", name="a").resource_version == seq + 2


def test_a_batch_transaction_that_fails_to_open_leaves_no_lock_held(sqlite_url, monkeypatch):
    """On SQLite a batch's transaction begins (BEGIN IMMEDIATE: the file's write lock), then
    reads the change sequence; a failure there rolls the transaction back, so the next
    writer, in this process or another, is not locked out."""
    from reconciler.store import batches

    store = Store(sqlite_url)
    try:
        _create(store, "a")
        reads = batches.seq_in

        def fails_once(conn):
            monkeypatch.setattr(batches, "seq_in", reads)
            raise StoreError("the sequence could not be read")

        monkeypatch.setattr(batches, "seq_in", fails_once)
        with pytest.raises(StoreError, match="could not be read"), store.batch():
            store.epoch()
        _set_phase_elsewhere(store, "a", "Queued")  # another thread writes at once
    finally:
        store.dispose()


def test_another_process_s_commit_between_epoch_safe_ones_ends_the_epoch(pg_url):
    """Only this process's epoch-safe commits are passed over: another process's (a second
    store, as another process has), epoch-safe for itself or not, ends the epoch."""
    store, other = Store(pg_url), Store(pg_url)
    try:
        a = _create(store, "a")
        with store.batch():
            first = store.epoch()
            _set_phase(store, a, "Queued")
        _beat(store)
        _beat(other)  # epoch-safe where it was written, unknown here
        _beat(store)
        with store.batch():
            assert store.epoch() not in (None, first)
    finally:
        other.dispose()
        store.dispose()
