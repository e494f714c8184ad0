"""A message survives a crash between storing its job and acknowledging it (API.md 1.3): the
controller is SIGKILLed right after the batch's transaction commits
(`RECONCILER_FAULT=after-ingest`), before the broker hears of it. The broker hands the message
back when the connection dies; the next controller receives it again, finds its job by the
message id, acknowledges it, and exactly one job exists."""

from __future__ import annotations

import json
import signal

from tests.crash.harness import API, Env
from tests.data.rabbit import Broker
from tests.helpers import wait_until


def test_a_message_stored_but_not_acknowledged_makes_one_job_after_restart(env: Env):
    broker = Broker()
    try:
        queue, _ = broker.queue("rccrash")
        source = {
            "apiVersion": API,
            "kind": "Source",
            "metadata": {"name": "inbox"},
            "spec": {"amqp": {"url": "amqp://guest:guest@127.0.0.1:5672/", "queue": queue}},
        }
        env.apply(source)
        broker.publish(queue, json.dumps({"command": "exit 0"}), "only-once")
        faulty = env.start_controller("after-ingest", ready=False)
        assert faulty.wait_exit() == -signal.SIGKILL, f"the controller did not die after ingesting:\n{faulty.log()}"

        [stored] = env.rows("SELECT name, annotations FROM objects WHERE kind = 'Job'")
        assert json.loads(stored.annotations)["reconciler.dev/message-id"] == "only-once"
        # not acknowledged: back in the queue once the broker sees the connection gone
        wait_until(lambda: broker.depth(queue) == (1, 0), 30, interval=0.2, message="the message requeued")

        env.start_controller()
        wait_until(lambda: broker.depth(queue) == (0, 0), 30, interval=0.2, message="acknowledged after restart")
        status = wait_until(
            lambda: (s := env.obj("inbox", "Source").status or {}).get("duplicates") == 1 and s,
            30,
            message="the redelivery counted",
        )
        assert (status["received"], status["created"], status["duplicates"]) == (2, 1, 1)
        assert [r.name for r in env.rows("SELECT name FROM objects WHERE kind = 'Job'")] == [stored.name]
        assert env.wait_completed([stored.name])[stored.name]["outcome"] == "Succeeded"
    finally:
        broker.close()
