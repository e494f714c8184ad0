"""Notifier delivery, one lane at a time with a fake clock (controller/notify.py): the backoff
schedule (1s doubling, at most 5m apart), the 24h give-up with the last error, the lane's own
pause while its receiver keeps failing, the events written with a job's status
(controller/notices.py), the signature, and what deleting a notifier does. Real SQLite
and PostgreSQL stores, real commands and a real HTTP server on loopback; only time is faked."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from pathlib import Path

import pytest

from reconciler.agent.local import process_owner
from reconciler.apply import apply_manifests, delete
from reconciler.clock import FakeClock
from reconciler.controller import notify
from reconciler.controller.notices import Notice, record
from reconciler.manifests import parse_text
from reconciler.store import Store, outbox
from reconciler.store import repository as repo
from reconciler.store.dbapi import Statement
from tests.data.receiver import Receiver

DAY = 24 * 3600.0


@pytest.fixture
def store(store_url):
    s = Store(store_url)
    yield s
    s.dispose()


def notifier(name: str, **spec) -> str:
    return json.dumps(
        {"apiVersion": "reconciler.dev/v1alpha1", "kind": "Notifier", "metadata": {"name": name}, "spec": spec}
    )


def apply(store: Store, tmp_path: Path, *docs: str) -> None:
    manifests, problems = parse_text("\n---\n".join(docs), "test.yaml", tmp_path)
    assert not problems, problems
    apply_manifests(store, manifests)


def add_event(store: Store, name: str, at: float, event_id: str = "e1") -> None:
    with store.write() as tx:
        outbox.add(tx, [outbox.Pending(name, event_id, json.dumps({"event_id": event_id}), at)])


def pending_rows(store: Store, name: str) -> list:
    with store.read() as conn:
        return Statement("SELECT * FROM outbox WHERE notifier = :n ORDER BY id").execute(conn, {"n": name}).all()


def counts(store: Store, name: str) -> outbox.Deliveries:
    with store.read() as conn:
        return outbox.deliveries(conn, name)


def test_retry_delay_doubles_from_one_second_to_five_minutes():
    assert [notify.retry_delay(n) for n in range(1, 12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert notify.retry_delay(10_000) == 300


def test_a_failing_event_is_retried_on_schedule_then_failed_after_24h(store, tmp_path):
    apply(store, tmp_path, notifier("pager", command=["false"]))
    clock = FakeClock()
    created = clock.now()
    add_event(store, "pager", created)
    lane = notify.Lane(store, "pager", clock=clock, owner="test:1:1")

    attempts: list[float] = []  # since the event; each step is called when the lane said, so each tries
    while pending_rows(store, "pager"):
        attempts.append(clock.now() - created)
        wait = lane.step()
        assert wait is not None and wait > 0
        if rows := pending_rows(store, "pager"):
            assert rows[0].attempts == len(attempts)
            assert rows[0].next_attempt_at == clock.now() + notify.retry_delay(len(attempts))
            assert lane.step() == wait  # nothing is tried before it is due
            assert pending_rows(store, "pager")[0].attempts == len(attempts)
        clock.advance(wait)

    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert set(gaps[10:]) == {300}
    assert attempts[-1] >= DAY and attempts[-2] < DAY  # retried for 24h since the event, then given up
    found = counts(store, "pager")
    assert (found.delivered, found.pending, found.failed) == (0, 0, 1)
    assert found.last_error == "false exited with code 1"


def test_a_dead_receiver_gets_one_attempt_per_backoff_step_not_one_per_event(store, tmp_path):
    """The lane pauses as a whole: ten pending events and a receiver that refuses every
    connection cost one attempt at 0s, 1s, 3s, 7s ... (the lane's consecutive failures), and
    once it answers again every event goes at once."""
    apply(store, tmp_path, notifier("hook", url="http://127.0.0.1:9/"))  # the discard port: nothing listens
    clock = FakeClock()
    for i in range(10):
        add_event(store, "hook", clock.now(), f"e{i}")
    lane = notify.Lane(store, "hook", clock=clock, owner="test:1:1")
    tried = []
    for _ in range(4):
        wait = lane.step()
        tried.append(sum(r.attempts for r in pending_rows(store, "hook")))
        assert lane.step() == pytest.approx(wait)  # paused: no attempt before the pause ends
        clock.advance(wait)
    assert tried == [1, 2, 3, 4]
    assert "POST http://127.0.0.1:9/" in counts(store, "hook").last_error


def test_events_older_than_24h_fail_with_the_receivers_error_when_it_keeps_failing(store, tmp_path):
    apply(store, tmp_path, notifier("pager", command=["false"]))
    clock = FakeClock()
    add_event(store, "pager", clock.now() - DAY - 5, "old-1")
    add_event(store, "pager", clock.now() - DAY - 1, "old-2")
    add_event(store, "pager", clock.now(), "new")
    notify.Lane(store, "pager", clock=clock, owner="test:1:1").step()
    assert [r.event_id for r in pending_rows(store, "pager")] == ["new"]
    found = counts(store, "pager")
    assert found.failed == 2
    assert found.last_error == "not delivered within 24h; the receiver's last error: false exited with code 1"


def test_a_missing_secret_file_is_a_delivery_failure_naming_it(store, tmp_path):
    apply(store, tmp_path, notifier("hook", url="http://127.0.0.1:9/", secretRef={"file": "missing-key"}))
    clock = FakeClock()
    add_event(store, "hook", clock.now())
    notify.Lane(store, "hook", clock=clock, owner="test:1:1").step()
    error = counts(store, "hook").last_error
    assert error == f"secretRef file {tmp_path / 'missing-key'}: No such file or directory"
    assert pending_rows(store, "hook")[0].attempts == 1


def test_webhook_body_is_signed_with_the_key_read_at_delivery(store, tmp_path):
    with Receiver() as receiver:
        apply(store, tmp_path, notifier("hook", url=f"{receiver.url}/ok", secretRef={"file": "key"}))
        (tmp_path / "key").write_text("s3cret\n")  # one trailing newline is not part of the key
        clock = FakeClock()
        add_event(store, "hook", clock.now(), "abc")
        lane = notify.Lane(store, "hook", clock=clock, owner="test:1:1")
        assert lane.step() == 0.0
        lane.close()
    [request] = receiver.requests
    assert request.headers["X-Reconciler-Event"] == "abc"
    digest = hmac.new(b"s3cret", request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Reconciler-Signature"] == f"sha256={digest}"
    assert request.headers["Content-Type"] == "application/json"
    found = counts(store, "hook")
    assert (found.delivered, found.pending, found.failed, found.last_delivery_at) == (1, 0, 0, clock.now())


def test_a_status_write_records_one_event_per_hearing_notifier(store, tmp_path):
    apply(
        store,
        tmp_path,
        notifier("all", command=["true"], events=["Succeeded", "Started"]),
        notifier("team-a", command=["true"], selector="team=a"),
        notifier("failures", command=["true"], events=["Failed"]),
    )
    with store.write() as tx:
        job = repo.create(tx, kind="Job", name="j", spec={"command": ["true"]}, labels={"team": "a"}, annotations={})
        assert record(tx, job, [Notice("Succeeded", "Succeeded", 2, 1_800_000_000.5)])
        assert not record(tx, job, [Notice("Retrying", "BackoffScheduled", 1, 1_800_000_000.0)])
    all_rows, team_rows = pending_rows(store, "all"), pending_rows(store, "team-a")
    assert pending_rows(store, "failures") == []
    assert len(all_rows) == len(team_rows) == 1
    assert all_rows[0].body == team_rows[0].body  # one event, one id, for every notifier
    body = json.loads(all_rows[0].body)
    assert list(body) == ["job_id", "name", "uid", "status", "outcome", "reason", "run", "time", "event_id"]
    assert body == {
        "job_id": "j",
        "name": "j",
        "uid": job.uid,
        "status": "done",
        "outcome": "Succeeded",
        "reason": "Succeeded",
        "run": 2,
        "time": "2027-01-15T08:00:00.500Z",
        "event_id": all_rows[0].event_id,
    }


def test_deleting_a_notifier_drops_its_pending_events_and_counts(store, tmp_path):
    apply(store, tmp_path, notifier("gone", command=["false"]), notifier("kept", command=["false"]))
    clock = FakeClock()
    add_event(store, "gone", clock.now(), "a")
    add_event(store, "kept", clock.now(), "b")
    notify.Lane(store, "gone", clock=clock, owner="test:1:1").step()
    assert counts(store, "gone").last_error
    delete(store, [("Notifier", "gone")])
    assert pending_rows(store, "gone") == []
    assert counts(store, "gone") == outbox.Deliveries(0, 0, 0, None, None, None)
    assert [r.event_id for r in pending_rows(store, "kept")] == ["b"]
    lane = notify.Lane(store, "gone", clock=clock, owner="test:1:1")
    assert lane.step() is None and lane.gone


def test_a_lease_held_by_a_live_process_keeps_another_from_delivering(store, tmp_path):
    apply(store, tmp_path, notifier("pager", command=["true"]))
    clock = FakeClock()
    add_event(store, "pager", clock.now())
    other = process_owner()  # this very process: alive
    with store.write() as tx:
        assert outbox.lease(tx, "pager", other, now=clock.now(), until=clock.now() + notify.LEASE)
    assert notify.Lane(store, "pager", clock=clock, owner="someone:2:2").step() == notify.POLL
    assert len(pending_rows(store, "pager")) == 1
    clock.advance(notify.LEASE)  # the lease ran out: taken over
    assert notify.Lane(store, "pager", clock=clock, owner="someone:2:2").step() == 0.0
    assert counts(store, "pager").delivered == 1


def test_a_password_in_the_url_stays_out_of_the_error(store, tmp_path):
    apply(store, tmp_path, notifier("hook", url="http://bot:hunter2@127.0.0.1:9/jobs"))
    clock = FakeClock()
    add_event(store, "hook", clock.now())
    notify.Lane(store, "hook", clock=clock, owner="test:1:1").step()
    error = counts(store, "hook").last_error
    assert error.startswith("POST http://***@127.0.0.1:9/jobs: ") and "hunter2" not in error


def test_a_password_holding_an_at_stays_out_of_the_error(store, tmp_path):
    """URL parsers split the user info at the last @ before the host: so does the mask."""
    apply(store, tmp_path, notifier("hook", url="http://bot:hunt@er2@127.0.0.1:9/jobs"))
    clock = FakeClock()
    add_event(store, "hook", clock.now())
    notify.Lane(store, "hook", clock=clock, owner="test:1:1").step()
    error = counts(store, "hook").last_error
    assert error.startswith("POST http://***@127.0.0.1:9/jobs: ") and "er2" not in error, error


def test_a_deadline_cuts_only_its_own_attempt_never_the_next():
    """A watchdog whose timer runs late (its attempt already over) must not shut the
    connection the lane's next attempt is using; an attempt still in flight is cut."""
    import socket

    conns = notify.Connections()
    ours, theirs = socket.socketpair()

    class Stream:  # what httpcore's trace hands over: a stream that names its socket
        def get_extra_info(self, name: str) -> object:
            return ours if name == "socket" else None

    stream = Stream()
    conns.trace("connection.connect_tcp.complete", {"return_value": stream})
    try:
        late = conns.begin()
        conns.end()  # the attempt answered at its deadline
        conns.begin()  # the next attempt, on the same connection
        conns.cut(late)
        theirs.sendall(b"x")
        assert ours.recv(1) == b"x"  # not shut down
        conns.cut(conns._attempt)  # the attempt in flight at its own deadline
        assert ours.recv(1) == b""  # shut down: a blocked read returns
    finally:
        ours.close()
        theirs.close()
        conns.close()
