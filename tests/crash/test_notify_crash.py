"""A notification survives a crash (API.md 1.3): the controller is SIGKILLed right after a job's
completion is written (`RECONCILER_FAULT=after-completion`), before anything could deliver
it; the event waits in the outbox, and the next controller delivers it, with the event_id
written with the completion."""

from __future__ import annotations

import json
import signal

from tests.crash.harness import API, Env, job
from tests.data.receiver import Receiver
from tests.helpers import wait_until


def test_a_completion_notified_after_a_crash_arrives_after_restart(env: Env):
    with Receiver() as receiver:
        hook = {
            "apiVersion": API,
            "kind": "Notifier",
            "metadata": {"name": "hook"},
            "spec": {"url": f"{receiver.url}/ok"},
        }
        env.apply(hook, job("build", "exit 0"))
        faulty = env.start_controller("after-completion", ready=False)
        assert faulty.wait_exit() == -signal.SIGKILL, (
            f"the controller did not die after the completion:\n{faulty.log()}"
        )

        assert env.status("build")["outcome"] == "Succeeded"
        [pending] = env.rows("SELECT event_id, body, attempts FROM outbox WHERE notifier = 'hook'")
        assert (pending.attempts, receiver.requests) == (0, [])

        env.start_controller()
        [request] = wait_until(lambda: receiver.requests, timeout=30, message="the notification after restart")
        wait_until(lambda: not env.rows("SELECT id FROM outbox"), timeout=30, message="the outbox drained")
    body = json.loads(request.body)
    assert (body["event_id"], body["name"], body["outcome"]) == (pending.event_id, "build", "Succeeded")
    assert request.headers["X-Reconciler-Event"] == pending.event_id
    assert request.body.decode() == pending.body
    [counts] = env.rows("SELECT delivered, failed FROM deliveries WHERE notifier = 'hook'")
    assert (counts.delivered, counts.failed) == (1, 0)
