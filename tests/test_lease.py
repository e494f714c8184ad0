"""The controller lease and the term fence (store/lease.py, transactions.Fence), on both stores:
who may take the lease and when, and that a former leader's writes are refused once the
lease changed hands while everyone else's go on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from reconciler.controller.owners import controller_owner, released, term_of
from reconciler.store import Store, eventlog
from reconciler.store import lease as leases
from reconciler.store import repository as repo
from reconciler.store.transactions import Fence, Fenced
from tests.helpers import wait_until


@pytest.fixture
def stores(store_url):
    """Two stores on one database, as two servers have."""
    first, second = Store(store_url), Store(store_url)
    yield first, second
    first.dispose()
    second.dispose()


def _take(store: Store, holder: str, period: float, gone: str | None = None) -> int | None:
    with store.write() as tx:
        return leases.take(tx, holder, period, gone=gone)


def _lease(store: Store) -> leases.Lease:
    with store.read() as conn:
        found = leases.read(conn)
    assert found is not None
    return found


def test_one_holder_at_a_time_and_the_term_grows_with_each_new_holder(stores):
    a, b = stores
    assert _take(a, "a", 30) == 1
    assert _take(b, "b", 30) is None  # held and not expired
    with a.write() as tx:
        assert leases.renew(tx, "a", 1, 30)
    lease = _lease(b)
    assert (lease.holder, lease.term) == ("a", 1)
    assert 29 < lease.expires_in <= 30

    with a.write() as tx:  # a clean stop: the next server takes it at once
        leases.release(tx, "a", 1)
    assert _lease(b).holder is None
    assert _take(b, "b", 30) == 2
    with a.write() as tx:  # a's term is over: no renewal brings it back
        assert not leases.renew(tx, "a", 1, 30)
    assert _take(a, "a", 30, gone="someone-else") is None  # `gone` names another holder: nothing taken
    assert _take(a, "a", 30, gone="b") == 3  # its holder proven gone (a dead process on this host)
    assert [_lease(b).holder, _lease(b).term] == ["a", 3]


def test_an_expired_lease_is_taken_by_the_next_server(stores):
    a, b = stores
    assert _take(a, "a", 0.3) == 1
    assert _take(b, "b", 0.3) is None
    wait_until(lambda: _lease(b).expires_in < 0, timeout=10, message="the lease expired")
    assert _take(b, "b", 30) == 2


def test_a_former_leaders_writes_fail_the_term_check_and_write_nothing(stores):
    a, b = stores
    assert _take(a, "a", 0.2) == 1
    a.fence = Fence(1, time.monotonic() + 0.2)
    with a.write(known=True) as tx:  # a leads: its controller writes
        obj = repo.create(tx, kind="Job", name="j", spec={"command": ["true"]}, labels={}, annotations={})
    wait_until(lambda: _lease(b).expires_in < 0, timeout=10, message="the lease expired")
    assert _take(b, "b", 30) == 2  # b leads now; a was paused and knows nothing of it

    seq = b.change_seq()
    with pytest.raises(Fenced, match="term 2, not 1"), a.write(known=True) as tx:
        repo.update_object(tx, obj, status={"phase": "Running"})
    assert a.fence.broken.is_set() and not a.fence.holds()
    with pytest.raises(Fenced, match="does not lead"), a.write(known=True) as tx:
        repo.update_object(tx, obj, status={"phase": "Running"})
    assert b.change_seq() == seq
    with b.read() as conn:
        assert repo.get(conn, kind="Job", name="j").status is None
    with a.write() as tx:  # the API's writes (apply, cancel) are no controller's: they go on
        repo.update_object(tx, obj, labels={"applied": "through-a"})
    with b.read() as conn:
        assert repo.get(conn, kind="Job", name="j").labels == {"applied": "through-a"}


def test_the_fence_holds_only_within_the_lease_period_seen_locally():
    fence = Fence(4, time.monotonic() + 60)
    assert fence.holds()
    assert not Fence(4, time.monotonic() - 0.001).holds()  # paused past its period: acts on no process
    fence.broken.set()
    assert not fence.holds()


def test_what_a_former_leader_claimed_is_released_to_the_leader_of_a_later_term():
    me = controller_owner(5)
    assert term_of(me) == 5 and term_of(controller_owner(None)) is None
    host_pid_start = me.rpartition("/term")[0]
    assert released(f"{host_pid_start}/term4", me)  # this very process, in an earlier term
    assert not released(f"{host_pid_start}/term6", me)
    assert not released(host_pid_start, me)  # a controller outside the election, alive: not released
    assert not released(f"{host_pid_start}/term4", controller_owner(None))  # no term to compare with

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"{host_pid_start.split(':')[0]}:{gone.stdout.strip()}:1.0/term9"
    assert released(dead, me)  # its process is gone, whatever its term


class _Recorded:
    """What a won term starts, in place of a controller: it records its stop."""

    def __init__(self, term: int, log: list):
        self.term, self.log = term, log
        log.append(("lead", term))

    def stop(self, *, drain: bool = True) -> None:
        self.log.append(("stop", self.term, drain))


@pytest.mark.postgres
def test_the_election_thread_leads_renews_steps_down_and_hands_over(pg_url):
    """Two elections on one store (as two servers): the first leads, renews past its period,
    hands over on a clean stop; the second, fenced by a term it finds moved on, steps down."""
    from reconciler.controller.leader import Leadership

    stores = [Store(pg_url), Store(pg_url)]
    logs: list[list] = [[], []]
    first = Leadership(stores[0], lambda term: _Recorded(term, logs[0]), period=1.0, holder="one")
    second = Leadership(stores[1], lambda term: _Recorded(term, logs[1]), period=1.0, holder="two")
    try:
        first.start()
        second.start()
        assert logs == [[("lead", 1)], []]
        assert first.describe()["leader"] and not second.describe()["leader"]
        assert not stores[1].fence.holds()  # the follower's controller writes are refused
        before = _lease(stores[0]).expires_at
        wait_until(lambda: _lease(stores[0]).expires_at > before + 1, timeout=10, message="renewed past its period")
        assert first.term == 1 and second.term is None

        first.stop()  # releases the lease: the other leads at its next look
        assert logs[0] == [("lead", 1), ("stop", 1, True)]
        wait_until(lambda: second.term == 2, timeout=10, message="the second leads")
        assert logs[1] == [("lead", 2)] and _lease(stores[1]).holder == second.holder

        with stores[0].write() as tx:  # another server takes the lease behind its back
            assert leases.take(tx, "elsewhere", 60, gone=second.holder) == 3
        with pytest.raises(Fenced), stores[1].write(known=True) as tx:
            eventlog.record  # noqa: B018  (nothing is written: the term check fails first)
        wait_until(lambda: second.term is None, timeout=10, message="it stepped down")
        assert logs[1] == [("lead", 2), ("stop", 2, False)]
        assert not second.describe()["leader"] and second.describe()["holder"] == "elsewhere"
    finally:
        first.stop()
        second.stop()
        for store in stores:
            store.dispose()
