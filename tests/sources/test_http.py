"""Sources over the seed's HTTP queue protocol (API.md 1.3), against a small queue server
written for the test (tests/data/httpqueue.py) and a real controller process: messages
become jobs and are DELETEd only once stored; an invalid one is deleted too, with a Warning
event naming the field; one delivered again creates nothing; a server that answers errors is
shown in the Source's status and asked again."""

from __future__ import annotations

import json

from tests.crash.harness import API, Env
from tests.data.httpqueue import QueueServer
from tests.helpers import wait_until

from .test_amqp import jobs, wait_jobs, wait_source


def source(url: str, queue: str = "jobs", **template) -> dict:
    spec: dict = {"http": {"url": url, "queue": queue}}
    if template:
        spec["template"] = template
    return {"apiVersion": API, "kind": "Source", "metadata": {"name": "inbox"}, "spec": spec}


def test_messages_become_jobs_and_are_deleted_once_stored(env: Env):
    with QueueServer() as server:
        server.put("jobs", "101", json.dumps({"command": "exit 0", "env_vars": {"A": "1"}}))
        manifest = {"apiVersion": API, "kind": "Job", "metadata": {"name": "built"}, "spec": {"shell": "exit 0"}}
        server.put("jobs", "102", manifest)  # a JSON value as the body: its JSON text
        server.put("jobs", "103", {"command": "exit 0", "port": 80})  # port without job_type service
        env.apply(source(server.url, labels={"from": "queue"}))
        env.start_controller()

        found = wait_jobs(env, 2)
        wait_until(lambda: not server.waiting("jobs"), 30, message="every message deleted")
        assert sorted(found) == ["built", "job-1"]
        assert sorted(server.deleted) == [("jobs", "101"), ("jobs", "102"), ("jobs", "103")]
        status = wait_source(env, lambda s: s.get("rejected") == 1 and s.get("connected") is True, "counted")
        assert (status["received"], status["created"]) == (3, 2)
        assert status["lastError"].startswith("message 103: spec.port: port is only allowed on a service job")
        [warning] = env.rows("SELECT * FROM events WHERE kind = 'Source' AND type = 'Warning'")
        assert warning.message == status["lastError"]
        env.wait_completed(["built", "job-1"])
        assert env.get_json("job-1")["metadata"]["labels"] == {"from": "queue"}
        assert env.get_json("job-1")["metadata"]["annotations"]["reconciler.dev/message-id"] == "101"

        # the server delivers one again (its DELETE lost, say): it was stored, so it is deleted, no new job
        server.put("jobs", "101", json.dumps({"command": "exit 0", "env_vars": {"A": "1"}}))
        wait_source(env, lambda s: s.get("duplicates") == 1, "the redelivery counted")
        wait_until(lambda: not server.waiting("jobs"), 30, message="deleted again")
        assert sorted(jobs(env)) == ["built", "job-1"]


def test_a_queue_server_that_fails_is_shown_and_asked_again(env: Env):
    with QueueServer() as server:
        server.down = True
        server.put("jobs", "1", json.dumps({"command": "true"}))
        env.apply(source(server.url))
        controller = env.start_controller()

        down = wait_source(env, lambda s: s.get("lastError"), "the error shown")
        assert down["connected"] is False and "HTTP 503" in down["lastError"]
        assert server.waiting("jobs") == ["1"] and not jobs(env)

        server.down = False
        wait_jobs(env, 1, timeout=60)
        wait_source(env, lambda s: s.get("connected") is True, "connected")
        wait_until(lambda: not server.waiting("jobs"), 30, message="deleted")
        assert controller.proc.poll() is None


def test_a_malformed_entry_is_refused_alone_and_the_others_are_ingested(env: Env):
    """An entry with an id but no body is rejected and deleted like an invalid message; one
    without an id cannot be deleted: it is said once (the queue answers it on every GET) and
    skipped. The valid messages of the same answer become jobs; the Source stays connected."""
    with QueueServer() as server:
        server.put("jobs", "m5", {"command": "exit 0"})
        server.put("jobs", "m6", {"command": "exit 0"})
        server.raw = [{"id": "m7"}, {"body": {"command": "exit 0"}}]  # no body; no id
        env.apply(source(server.url))
        controller = env.start_controller()

        assert sorted(wait_jobs(env, 2)) == ["job-1", "job-2"]
        wait_until(lambda: not server.waiting("jobs"), 30, message="m5 and m6 deleted")
        status = wait_source(env, lambda s: s.get("rejected") == 2, "the two refusals counted")
        assert status["connected"] is True and status["created"] == 2
        wait_until(lambda: ("jobs", "m7") in server.deleted, 30, message="m7 deleted")
        gets = server.gets
        wait_until(lambda: server.gets >= gets + 3, 30, message="more GETs answering the id-less entry")
        warnings = [r.message for r in env.rows("SELECT * FROM events WHERE kind = 'Source' AND type = 'Warning'")]
        assert sorted(warnings) == [
            'message (no id): id: missing, so it cannot be deleted; skipped (the queue keeps it): {"body": '
            '{"command": "exit 0"}}',
            "message m7: body: missing",
        ], warnings
        assert wait_source(env, lambda s: True, "status")["rejected"] == 2  # said once, not once a GET
        assert controller.log().count("an entry without an id skipped") == 1


def test_the_controller_logs_no_queue_password_and_no_line_per_poll(env: Env):
    """httpx says each request at INFO with its URL whole: the controller keeps it quiet, as
    `serve` and the node agent do."""
    with QueueServer() as server:
        secret_url = server.url.replace("http://", "http://queue-user:s3cr3t-pw@")
        env.apply(source(secret_url))
        controller = env.start_controller()
        wait_source(env, lambda s: s.get("connected") is True, "connected")
        gets = server.gets
        wait_until(lambda: server.gets >= gets + 4, 30, message="empty polls")
        log = controller.log()
        assert "s3cr3t-pw" not in log and "HTTP Request" not in log, log


def test_entries_without_an_id_said_before_do_not_hold_back_the_messages_behind_them():
    """A queue keeps answering the entries it cannot delete: once said, they count for
    nothing, so a message behind a full answer's worth of them is ingested."""
    import threading

    from reconciler.api.source import HttpQueue
    from reconciler.controller.httpqueue import MAX_MESSAGES, NO_ID, HttpConsumer

    consumer = HttpConsumer(HttpQueue.model_validate({"url": "http://127.0.0.1:9", "queue": "q"}), threading.Event())
    answer = [{"body": {"command": ["echo", str(n)]}} for n in range(MAX_MESSAGES)]
    answer.append({"id": "good", "body": {"command": ["true"]}})
    first = consumer._messages(answer)
    assert len(first) == MAX_MESSAGES and {m.id for m in first} == {NO_ID}  # each said once
    assert [m.id for m in consumer._messages(answer)] == ["good"]
