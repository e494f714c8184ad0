"""Sources through `reconciler serve` (API.md 4: `sources` is a kind of the API): created with
POST, consumed by the serve process's controller, listed with their counts, the same table
through `get sources --server` as on the store, and a refusal naming the field."""

from __future__ import annotations

import json

from tests.data.httpqueue import QueueServer
from tests.helpers import wait_until

from .conftest import PREFIX, Server


def test_a_source_created_through_the_api_is_consumed_and_listed(server: Server):
    http = server.http()
    with QueueServer() as queue:
        queue.put("jobs", "7", json.dumps({"command": "exit 0"}))
        body = {
            "apiVersion": "reconciler.dev/v1alpha1",
            "kind": "Source",
            "metadata": {"name": "inbox"},
            "spec": {"http": {"url": queue.url, "queue": "jobs"}, "template": {"labels": {"from": "api"}}},
        }
        created = http.post(f"{PREFIX}/sources", json=body)
        assert created.status_code == 201, created.text

        def counted() -> dict | None:
            [item] = http.get(f"{PREFIX}/sources").json()["items"]
            status = item.get("status") or {}
            return item if status.get("created") == 1 and status.get("connected") else None

        item = wait_until(counted, timeout=30, message="the message ingested by serve's controller")
        assert item["kind"] == "Source" and item["status"]["received"] == 1
        listing = http.get(f"{PREFIX}/sources").json()
        assert listing["kind"] == "SourceList"
        job = http.get(f"{PREFIX}/jobs/job-1").json()
        assert job["metadata"]["labels"] == {"from": "api"}
        assert job["metadata"]["annotations"]["reconciler.dev/message-id"] == "7"
        wait_until(lambda: not queue.waiting("jobs"), 30, message="deleted from the queue")

        remote, local = server.cli("get", "sources"), server.local("get", "sources")
        assert remote.code == 0 and remote.stdout.split()[:15] == local.stdout.split()[:15], (remote, local)
        described = server.cli("describe", "source", "inbox")
        assert described.code == 0 and "Created:         1" in described.stdout

    refused = http.post(f"{PREFIX}/sources", json={**body, "metadata": {"name": "both"}, "spec": {}})
    assert refused.status_code == 422 and "spec: " in refused.json()["message"], refused.text
