"""The controller lease and the term fence (store/lease.py, engine.Fence), on both stores:
who may take the lease and when, and that a former leader's writes are refused once the
lease changed hands while everyone else's go on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from reconciler.controller.owners import controller_owner, released, term_of
from reconciler.store import Store
from reconciler.store import lease as leases
from reconciler.store import repository as repo
from reconciler.store.engine import Fence, Fenced
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
