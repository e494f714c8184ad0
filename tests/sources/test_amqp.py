"""Sources on the machine's real RabbitMQ (API.md 1.3): a real controller process consumes a
queue made for the test; messages become jobs that run, and the broker's own counts show each
message settled only after its job exists. An invalid message goes to the queue's dead-letter
exchange with a Warning event naming the field; a redelivery creates nothing new; a broker
that is down, or goes away, is shown in the Source's status and reconnected to, losing
nothing."""

from __future__ import annotations

import json

import yaml

from tests.crash.harness import API, Env, job
from tests.data.rabbit import Broker, close_connections, wait_connections
from tests.helpers import wait_until

from .conftest import Relay

BROKER = "amqp://guest:guest@127.0.0.1:5672/"


def source(queue: str, url: str = BROKER, name: str = "inbox", **template) -> dict:
    spec: dict = {"amqp": {"url": url, "queue": queue}}
    if template:
        spec["template"] = template
    return {"apiVersion": API, "kind": "Source", "metadata": {"name": name}, "spec": spec}


def source_status(env: Env, name: str = "inbox") -> dict:
    obj = env.obj(name, "Source")
    assert obj is not None, f"source {name} not found"
    return obj.status or {}


def wait_source(env: Env, predicate, message: str, name: str = "inbox", timeout: float = 30) -> dict:
    last: dict = {}

    def check():
        nonlocal last
        last = source_status(env, name)
        return last if predicate(last) else None

    try:
        return wait_until(check, timeout, interval=0.05, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; source status: {json.dumps(last)}\n{env.logs()}") from None


def jobs(env: Env) -> dict:
    return {r.name: r for r in env.rows("SELECT name, labels, annotations, spec FROM objects WHERE kind = 'Job'")}


def wait_jobs(env: Env, count: int, timeout: float = 30) -> dict:
    def enough() -> dict | None:
        found = jobs(env)
        return found if len(found) >= count else None

    try:
        return wait_until(enough, timeout, message=f"{count} jobs")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; jobs: {sorted(jobs(env))}\n{env.logs()}") from None


def test_messages_of_each_form_become_jobs_that_run_and_are_acknowledged(env: Env, broker: Broker):
    queue, _ = broker.queue()
    env.apply(
        {"apiVersion": API, "kind": "Pool", "metadata": {"name": "batch"}, "spec": {"slots": 2}},
        source(queue, labels={"from": "inbox"}, pool="batch", retry={"limit": 1}),
    )
    broker.publish(queue, json.dumps({"command": "echo seed > seed.out", "env_vars": {"X": "1"}}), "m-seed")
    manifest = {"apiVersion": API, "kind": "Job", "metadata": {"name": "built", "labels": {"from": "ci"}}}
    manifest["spec"] = {"command": ["true"], "retry": {"limit": 0}}
    broker.publish(queue, yaml.safe_dump(manifest), "m-yaml")
    broker.publish(queue, json.dumps({"apiVersion": API, "kind": "Job", "spec": {"shell": "exit 0"}}), "m-json")
    env.start_controller()

    found = wait_jobs(env, 3)
    assert sorted(found) == ["built", "job-1", "job-2"]
    env.wait_completed(found, timeout=60)
    for name, message_id in (("job-1", "m-seed"), ("built", "m-yaml"), ("job-2", "m-json")):
        doc = env.get_json(name)
        assert doc["metadata"]["annotations"]["reconciler.dev/message-id"] == message_id
        assert doc["metadata"]["annotations"]["reconciler.dev/created-by"] == "source/inbox"
        assert doc["spec"]["pool"] == "batch"
        assert doc["status"]["outcome"] == "Succeeded", doc["status"]
    assert env.get_json("job-1")["metadata"]["labels"] == {"from": "inbox"}
    assert env.get_json("built")["metadata"]["labels"] == {"from": "ci"}  # the message wins
    assert env.get_json("job-1")["spec"]["retry"]["limit"] == 1 and env.get_json("built")["spec"]["retry"]["limit"] == 0
    assert env.get_json("job-1")["spec"]["env"] == {"X": "1"}

    wait_until(lambda: broker.depth(queue) == (0, 0), 30, interval=0.2, message="every message acknowledged")
    status = wait_source(env, lambda s: s.get("connected") is True, "connected")
    assert {k: status.get(k) for k in ("received", "created", "duplicates", "rejected")} == {
        "received": 3,
        "created": 3,
        "duplicates": 0,
        "rejected": 0,
    }
    row = env.cli("get", "sources").stdout.splitlines()[1].split()
    assert row[:6] == ["inbox", f"amqp:{queue}", "3", "3", "0", "true"]


def test_an_invalid_message_is_dead_lettered_with_a_warning_naming_the_field(env: Env, broker: Broker):
    queue, dead = broker.queue(dead_letters=True)
    env.apply(source(queue))
    bad = {"apiVersion": API, "kind": "Job", "metadata": {"name": "bad"}, "spec": {"shell": "true", "slots": "many"}}
    broker.publish(queue, json.dumps(bad), "bad-slots")
    broker.publish(queue, "key: [unclosed", "bad-yaml")
    broker.publish(queue, json.dumps({"command": "true"}), "good")
    env.start_controller()

    wait_jobs(env, 1)
    wait_source(env, lambda s: s.get("rejected") == 2 and s.get("created") == 1, "two rejected, one created")
    assert dead is not None
    dead_letters = wait_until(
        lambda: (found := broker.get(dead)) and found, 30, interval=0.1, message="the dead-letter queue"
    )
    while len(dead_letters) < 2:
        dead_letters += broker.get(dead)
    assert sorted(p.message_id for p, _ in dead_letters) == ["bad-slots", "bad-yaml"]
    assert {b for _, b in dead_letters} == {json.dumps(bad).encode(), b"key: [unclosed"}
    assert list(jobs(env)) == ["job-1"]
    wait_until(lambda: broker.depth(queue) == (0, 0), 30, interval=0.2, message="the queue emptied")

    warnings = env.rows("SELECT * FROM events WHERE kind = 'Source' AND type = 'Warning' ORDER BY id")
    assert [(w.reason, w.message.split(":")[0]) for w in warnings] == [
        ("MessageRejected", "message bad-slots"),
        ("MessageRejected", "message bad-yaml"),
    ]
    assert warnings[0].message.startswith("message bad-slots: spec.slots: ")
    assert warnings[1].message.startswith("message bad-yaml: body: neither JSON nor YAML")
    described = env.cli("describe", "source", "inbox").stdout
    assert "MessageRejected" in described and "Rejected:        2" in described


def test_a_redelivered_message_creates_nothing_new(env: Env, broker: Broker):
    queue, _ = broker.queue()
    env.apply(source(queue))
    request = json.dumps({"command": "true"})
    broker.publish(queue, request, "once")
    broker.publish(queue, request, "once")  # the same message again, as a producer retry or a redelivery
    broker.publish(queue, '{"command": "exit 0"}')  # no message id: known by its body
    broker.publish(queue, '{"command": "exit 0"}')
    env.start_controller()

    wait_source(env, lambda s: s.get("received") == 4, "four received")
    wait_until(lambda: broker.depth(queue) == (0, 0), 30, interval=0.2, message="all four acknowledged")
    status = source_status(env)
    assert (status["created"], status["duplicates"], status["rejected"]) == (2, 2, 0)
    found = jobs(env)
    assert sorted(found) == ["job-1", "job-2"]
    ids = sorted(json.loads(r.annotations)["reconciler.dev/message-id"] for r in found.values())
    assert ids[0] == "once" and ids[1].startswith("sha256:")


def test_a_broker_down_at_start_is_retried_until_it_comes_up(env: Env, broker: Broker, relay: Relay):
    queue, _ = broker.queue()
    env.apply(source(queue, url=relay.url), job("meanwhile", "exit 0"))
    broker.publish(queue, json.dumps({"command": "true"}), "waiting")
    controller = env.start_controller()

    down = wait_source(env, lambda s: s.get("lastError"), "the error shown")
    assert down["connected"] is False
    assert f"127.0.0.1:{relay.port}" in down["lastError"] and "Connection refused" in down["lastError"]
    assert "guest:guest" not in down["lastError"]
    # the lane says each failed attempt in one line; pika's own lines (seven and a traceback
    # an attempt) are kept out of the controller's log
    wait_until(lambda: "(retry 2)" in controller.log(), 30, message="two attempts said")
    log = controller.log()
    assert "Traceback" not in log and " pika." not in log, log
    assert env.wait_completed(["meanwhile"])["meanwhile"]["outcome"] == "Succeeded"  # the controller goes on
    assert broker.depth(queue) == (1, 0) and list(jobs(env)) == ["meanwhile"]

    relay.up()
    wait_until(lambda: "job-1" in jobs(env), 60, message="the message ingested once the broker is up")
    up = wait_source(env, lambda s: s.get("connected") is True, "connected")
    assert up["created"] == 1
    assert controller.proc.poll() is None
    wait_until(lambda: broker.depth(queue) == (0, 0), 30, interval=0.2, message="acknowledged")


def test_a_broker_that_goes_away_is_reconnected_to_and_nothing_is_lost(env: Env, broker: Broker, relay: Relay):
    queue, _ = broker.queue()
    relay.up()
    env.apply(source(queue, url=relay.url))
    env.start_controller()
    for i in range(5):
        broker.publish(queue, json.dumps({"command": "true"}), f"before-{i}")
    wait_jobs(env, 5)

    relay.down()  # the host goes away: the connection is cut, nothing listens
    gone = wait_source(env, lambda s: s.get("connected") is False, "disconnected")
    assert gone["lastError"]
    for i in range(5):
        broker.publish(queue, json.dumps({"command": "true"}), f"while-down-{i}")
    relay.up()
    wait_jobs(env, 10, timeout=60)
    wait_source(env, lambda s: s.get("connected") is True, "connected again")

    # the broker itself closes the connection: the controller reconnects at once
    assert close_connections("reconciler source/inbox", "closed by the test") == 1
    wait_source(env, lambda s: "CONNECTION_FORCED" in (s.get("lastError") or ""), "the broker's close shown")
    wait_connections("reconciler source/inbox")
    for i in range(5):
        broker.publish(queue, json.dumps({"command": "true"}), f"after-{i}")
    found = wait_jobs(env, 15, timeout=60)
    wait_until(lambda: broker.depth(queue) == (0, 0), 30, interval=0.2, message="acknowledged")
    ids = sorted(json.loads(r.annotations)["reconciler.dev/message-id"] for r in found.values())
    expected = sorted(f"{phase}-{i}" for phase in ("before", "while-down", "after") for i in range(5))
    assert ids == expected  # each message made exactly one job
    status = wait_source(env, lambda s: s.get("connected") is True, "connected")
    assert (status["created"], status["rejected"]) == (15, 0)


def test_a_queue_deleted_under_the_consumer_is_shown_and_consumed_again_once_made_again(env: Env, broker: Broker):
    """RabbitMQ cancels the consumer of a queue it deletes (Basic.Cancel) and the connection
    stays up: the Source says so and the lane keeps trying, instead of waiting on a consumer
    that will never be sent anything again."""
    queue, _ = broker.queue()
    env.apply(source(queue))
    env.start_controller()
    broker.publish(queue, json.dumps({"command": "true"}), "before")
    wait_jobs(env, 1)
    wait_source(env, lambda s: s.get("connected") is True, "connected")

    broker.channel.queue_delete(queue)
    gone = wait_source(env, lambda s: s.get("connected") is False, "the cancelled consumer shown")
    assert queue in gone["lastError"]

    broker.channel.queue_declare(queue, durable=True)
    broker.publish(queue, json.dumps({"command": "true"}), "after")
    found = wait_jobs(env, 2, timeout=60)
    ids = sorted(json.loads(r.annotations)["reconciler.dev/message-id"] for r in found.values())
    assert ids == ["after", "before"]
    wait_source(env, lambda s: s.get("connected") is True, "connected again")
    wait_until(lambda: broker.depth(queue) == (0, 0), 30, interval=0.2, message="acknowledged")


def test_a_source_changed_or_deleted_is_followed(env: Env, broker: Broker):
    first, _ = broker.queue()
    second, _ = broker.queue()
    env.apply(source(first))
    env.start_controller()
    broker.publish(first, json.dumps({"command": "true"}), "a")
    wait_jobs(env, 1)

    env.apply(source(second))  # another queue: the lane starts anew on it
    broker.publish(second, json.dumps({"command": "true"}), "b")
    wait_jobs(env, 2)
    env.cli("delete", "source", "inbox")
    wait_until(lambda: not _named_connections(), 30, interval=0.2, message="its connection closed")
    broker.publish(second, json.dumps({"command": "true"}), "c")
    assert broker.depth(second)[0] >= 1 and len(jobs(env)) == 2  # nothing consumes it any more
    assert not env.rows("SELECT * FROM ingested")  # what it remembered went with it
    assert env.controllers[0].proc.poll() is None


def _named_connections() -> list[str]:
    from tests.data.rabbit import connection_pids

    return connection_pids("reconciler source/inbox")


def test_up_consumes_no_source(env: Env, broker: Broker):
    """`up` ends with its jobs: a queue is left to a controller that stays."""
    queue, _ = broker.queue()
    env.apply(source(queue))
    broker.publish(queue, json.dumps({"command": "true"}), "left")
    path = env.work / "one.yaml"
    path.write_text(yaml.safe_dump(job("one", "exit 0")))
    env.cli("up", "-f", str(path), "--timeout", "60s")
    assert sorted(jobs(env)) == ["one"]
    assert broker.depth(queue) == (1, 0)
    assert source_status(env) == {}
