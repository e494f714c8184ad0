"""Notifiers deliver (API.md 1.3): a real controller process, real jobs, and a real HTTP server
on loopback written here (tests/data/receiver.py) or a real command. The event's fields and
headers, the HMAC, events and selector, redelivery with the same event_id, and a receiver
that hangs delaying neither jobs nor other notifiers. `get notifiers` and `describe notifier`
show what came of the deliveries."""

from __future__ import annotations

import hashlib
import hmac
import json
import re

from tests.data.receiver import Receiver
from tests.helpers import self_signed, wait_until

from .conftest import docs, job_yaml

BODY_FIELDS = ["job_id", "name", "uid", "status", "outcome", "reason", "run", "time", "event_id"]


def notifier_yaml(name: str, spec: str) -> str:
    return f"apiVersion: reconciler.dev/v1alpha1\nkind: Notifier\nmetadata: {{name: {name}}}\nspec:\n{spec}"


def start(env, *documents: str) -> None:
    """Apply the documents, then start a controller."""
    env.apply("all.yaml", docs(*documents))
    env.controller().wait_ready()


def wait_delivered(env, name: str, count: int) -> dict:
    """Until the notifier counts `count` deliveries and nothing pending."""
    from reconciler.reads import objects

    def done():
        [found] = objects(env.store, "Notifier", [name], None).objects
        status = found.status or {}
        return status if status.get("delivered") == count and status.get("pending") == 0 else None

    return wait_until(done, timeout=30, message=f"notifier {name}: {count} delivered") or {}


def test_webhook_and_command_receive_the_completion(env):
    out = env.root / "events.jsonl"
    (env.root / "hook.key").write_text("k3y\n")
    with Receiver() as receiver:
        start(
            env,
            notifier_yaml("hook", f"  url: {receiver.url}/ok\n  secretRef: {{file: hook.key}}\n"),
            notifier_yaml("desk", f"  command: [tee, -a, {out}]\n"),
            job_yaml("build", "command: [sh, -c, 'exit 0']"),
        )
        [request] = wait_until(lambda: receiver.at("/ok"), timeout=30, message="the webhook's POST")
        lines = wait_until(lambda: out.exists() and out.read_text().splitlines(), timeout=30, message="desk's stdin")

    status = env.status("build")
    body = json.loads(request.body)
    assert list(body) == BODY_FIELDS
    assert body == {
        "job_id": "build",
        "name": "build",
        "uid": env.peek("build")["metadata"]["uid"],
        "status": "done",
        "outcome": "Succeeded",
        "reason": status["reason"],
        "run": 1,
        "time": status["completionTime"],
        "event_id": body["event_id"],
    }
    assert request.headers["X-Reconciler-Event"] == body["event_id"]
    expected = "sha256=" + hmac.new(b"k3y", request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Reconciler-Signature"] == expected
    assert request.headers["Content-Type"] == "application/json"
    assert lines == [request.body.decode()]  # the command got the same event, byte for byte

    hook = wait_delivered(env, "hook", 1)
    wait_delivered(env, "desk", 1)
    assert (hook["failed"], "lastError" in hook) == (0, False)
    table = env.ok("get", "notifiers").stdout.splitlines()
    assert table[0].split() == ["NAME", "TARGET", "EVENTS", "DELIVERED", "PENDING", "FAILED", "AGE"]
    assert [line.split()[-4:-1] for line in table[1:]] == [["1", "0", "0"], ["1", "0", "0"]]
    described = env.ok("describe", "notifier", "hook").stdout
    assert re.search(r"Delivered:\s+1\n\s+Pending:\s+0\n\s+Failed:\s+0\n", described), described
    assert f"Last Delivery:   {hook['lastDeliveryTime']}" in described
    assert re.search(r"Last Error:\s+<none>", described), described


def test_events_and_selector_choose_what_a_notifier_hears(env):
    marker = env.root / "failed-once"
    flaky = f"shell: \"[ -e '{marker}' ] || {{ touch '{marker}'; exit 1; }}\"\n"
    flaky += "retry: {limit: 1, backoff: {delay: 100ms}}"
    with Receiver() as receiver:
        start(
            env,
            notifier_yaml("runs", f"  url: {receiver.url}/ok\n  events: [Started, Retrying]\n  selector: team=a\n"),
            notifier_yaml("fails", f"  url: {receiver.url}/ok\n  events: [Failed]\n  selector: 'team in (b)'\n"),
            job_yaml("a1", flaky, labels="{team: a}"),
            job_yaml("b1", "command: [sh, -c, 'exit 3']", labels="{team: b}"),
            job_yaml("c1", "command: [sh, -c, 'exit 3']", labels="{team: c}"),
        )
        env.wait_completed()
        # every event is in the outbox with its job's status: once both are drained, no more can come
        wait_delivered(env, "runs", 3)
        wait_delivered(env, "fails", 1)
        heard = [json.loads(r.body) for r in receiver.requests]
    assert sorted((e["name"], e["status"], e["outcome"], e["run"]) for e in heard) == [
        ("a1", "pending", None, 1),  # Retrying
        ("a1", "running", None, 1),  # Started
        ("a1", "running", None, 2),
        ("b1", "failed", "Failed", 1),
    ]
    retrying = next(e for e in heard if e["status"] == "pending")
    assert retrying["reason"] == "BackoffScheduled"
    assert len({e["event_id"] for e in heard}) == 4
    # a short run's start is written with its end, in one step: each event still says its own
    # move's reason and time, not those of the last move of the step
    started = sorted((e for e in heard if e["status"] == "running"), key=lambda e: e["run"])
    assert [e["reason"] for e in started] == ["Started", "Started"]
    assert [e["time"] for e in started] == [r["startedAt"] for r in env.status("a1")["runs"]]


def test_a_failed_delivery_is_retried_with_the_same_event_id(env):
    with Receiver() as receiver:
        start(env, notifier_yaml("hook", f"  url: {receiver.url}/flaky\n"), job_yaml("build", "command: [/bin/true]"))
        first, again = wait_until(
            lambda: receiver.requests if len(receiver.requests) >= 2 else None, timeout=30, message="a redelivery"
        )
        status = wait_delivered(env, "hook", 1)
    assert first.body == again.body  # the same event, byte for byte
    assert first.headers["X-Reconciler-Event"] == again.headers["X-Reconciler-Event"]
    assert again.at - first.at >= 0.9  # the first retry waits 1s
    assert status["lastError"] == f"POST {receiver.url}/flaky: HTTP 500 Internal Server Error"
    described = env.ok("describe", "notifier", "hook").stdout
    assert f"Last Error:      POST {receiver.url}/flaky: HTTP 500 Internal Server Error" in described


def test_a_receiver_that_hangs_delays_no_job_and_no_other_notifier(env):
    with Receiver() as receiver:
        start(
            env,
            notifier_yaml("stuck", f"  url: {receiver.url}/hang\n"),
            notifier_yaml("live", f"  url: {receiver.url}/ok\n"),
            job_yaml("first", "command: [/bin/true]"),
            job_yaml("second", "command: [/bin/true]\ndependsOn: [first]"),
        )
        env.wait_completed("first", "second")
        # a request is recorded as it arrives, and counted answered once its answer is sent
        wait_until(
            lambda: len(receiver.at("/ok")) == 2 and receiver.answered == 2 and receiver.at("/hang"),
            timeout=30,
            message="both POSTed, the live ones answered",
        )
        live = receiver.at("/ok")
        # all of that while the stuck receiver holds its first request, answering nothing
        assert receiver.answered == len(live) == 2
        assert len(receiver.at("/hang")) == 1
        assert {json.loads(r.body)["name"] for r in live} == {"first", "second"}
        receiver.release()
        wait_delivered(env, "stuck", 2)
    stuck = {json.loads(r.body)["event_id"] for r in receiver.at("/hang")}
    assert stuck == {json.loads(r.body)["event_id"] for r in live}  # the same two events


def test_a_running_job_deleted_is_heard_as_cancelled(env):
    """`delete` cancels an active job first (API.md 3): its notifiers hear it, as they would
    hear `cancel`, though the job is gone once its run is stopped."""
    with Receiver() as receiver:
        start(env, notifier_yaml("hook", f"  url: {receiver.url}/ok\n"), job_yaml("long", "command: [sleep, '60']"))
        wait_until(lambda: env.status("long").get("phase") == "Running", timeout=30, message="long running")
        env.ok("delete", "job", "long")
        [request] = wait_until(lambda: receiver.at("/ok"), timeout=30, message="the Cancelled event")
    body = json.loads(request.body)
    assert (body["name"], body["status"], body["outcome"], body["reason"], body["run"]) == (
        "long",
        "failed",
        "Cancelled",
        "Deleted",
        1,
    )


def test_a_2xx_whose_body_is_broken_off_delivers(env):
    """The answer is its status: a receiver that says 200 and closes before the body it
    announced has been heard, and the event is not sent again."""
    with Receiver() as receiver:
        start(env, notifier_yaml("hook", f"  url: {receiver.url}/cut\n"), job_yaml("build", "command: [/bin/true]"))
        status = wait_delivered(env, "hook", 1)
        assert (status["failed"], status.get("lastError"), len(receiver.at("/cut"))) == (0, None, 1)


def test_a_receiver_that_trickles_its_answer_does_not_hold_the_delivery(env):
    """The 200 came at once; a body sent a byte a second (each read well within the timeout)
    is read no longer than the delivery's 10 s: the event counts delivered without waiting
    out the 100 s the receiver would take."""
    with Receiver() as receiver:
        start(env, notifier_yaml("hook", f"  url: {receiver.url}/trickle\n"), job_yaml("build", "command: [/bin/true]"))
        status = wait_delivered(env, "hook", 1)
        assert (status["failed"], status.get("lastError")) == (0, None)


def test_a_receiver_that_trickles_its_header_lines_fails_the_attempt_at_10s(env):
    """API.md bounds an attempt at 10 s: a receiver sending a header line every 3 s (no read
    waits long) for 45 s fails the attempt by then, and it is retried as any failure."""
    from reconciler.api.meta import to_epoch
    from reconciler.reads import objects

    with Receiver() as receiver:
        start(
            env,
            notifier_yaml("hook", f"  url: {receiver.url}/slow-headers\n"),
            job_yaml("build", "command: [/bin/true]"),
        )

        def failed():
            [found] = objects(env.store, "Notifier", ["hook"], None).objects
            return (found.status or {}).get("lastError") and found.status

        status = wait_until(failed, timeout=25, message="the attempt failed by its deadline")
        [first] = receiver.at("/slow-headers")[:1]
        took = to_epoch(status["lastErrorTime"]) - first.at
        assert status["lastError"] == f"POST {receiver.url}/slow-headers: no answer within 10s"
        assert 9.5 <= took <= 12.0, took
        assert status["delivered"] == 0
        wait_until(lambda: len(receiver.at("/slow-headers")) >= 2, timeout=30, message="retried")


def test_an_https_receiver_that_trickles_its_header_lines_fails_the_attempt_at_10s(env, monkeypatch):
    """The HTTPS twin of the test above: TLS replaces the connection's TCP stream, and the
    attempt's deadline must cut that one (Connections traces both). The receiver is a real
    TLS server on loopback with a certificate made here, which the controller trusts through
    SSL_CERT_FILE (httpx's client reads it): each header line comes well within a read's
    timeout, so only the whole-attempt bound ends the attempt. Left alone, the receiver
    would answer 200 after 45 s: the first outcome is a failure, never that delivery."""
    from reconciler.controller.notify import TIMEOUT
    from reconciler.reads import objects

    cert, key = self_signed(env.root)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the controller's environment: it trusts the receiver
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with Receiver(tls=(cert, key)) as receiver:
        assert receiver.url.startswith("https://")
        start(
            env,
            notifier_yaml("hook", f"  url: {receiver.url}/slow-headers\n"),
            job_yaml("build", "command: [/bin/true]"),
        )

        def outcome():
            [found] = objects(env.store, "Notifier", ["hook"], None).objects
            status = found.status or {}
            return (status.get("lastError") or status.get("delivered")) and status

        # a deadline past the receiver's 45 s: without the cut, the delivery would come first
        status = wait_until(outcome, timeout=60, message="the first attempt's outcome")
        assert status.get("lastError") == f"POST {receiver.url}/slow-headers: no answer within {TIMEOUT:g}s", status
        assert status["delivered"] == 0
        assert receiver.at("/slow-headers"), "the request never came over TLS"
        wait_until(lambda: len(receiver.at("/slow-headers")) >= 2, timeout=30, message="retried")
