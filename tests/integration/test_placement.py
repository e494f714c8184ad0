"""Placement: the self-registered local node, nodeSelector, and a pin to a missing node."""

from __future__ import annotations

import json
import socket

from reconciler.controller.nodes import local_node_name

from .conftest import docs, job_yaml


def test_unschedulable_pin_and_local_node(env):
    env.controller()
    env.apply("pinned.yaml", job_yaml("pinned", "command: ['true']\nplacement: {nodeName: worker-9}"))
    status = env.wait_status("pinned", lambda s: s.get("reason") == "Unschedulable", what="Unschedulable")
    assert status["phase"] == "Queued"
    assert status["message"].startswith("0/1 nodes are available"), status["message"]
    assert "didn't match nodeName" in status["message"]
    assert not status.get("runs") and not status.get("admission")

    node = local_node_name()
    nodes = env.ok("get", "nodes").stdout.splitlines()
    assert nodes[0].split()[:2] == ["NAME", "STATUS"]
    assert [line.split()[:2] for line in nodes[1:]] == [[node, "Ready"]]
    (item,) = json.loads(env.ok("get", "nodes", "-o", "json").stdout)["items"]
    assert item["metadata"]["labels"]["reconciler.dev/hostname"] == socket.gethostname()[:63]
    assert {"type": "Ready", "status": "True"}.items() <= item["status"]["conditions"][0].items()
    # still Queued, with the reason on record as an event
    events = env.ok("get", "events", "pinned").stdout
    assert "FailedScheduling" in events and "0/1 nodes are available" in events
    assert env.status("pinned")["phase"] == "Queued"


def test_node_selector_matching_the_local_node_runs(env):
    hostname = socket.gethostname()[:63]
    manifest = env.write(
        "selected.yaml",
        docs(
            job_yaml(
                "selected", f"command: ['true']\nplacement: {{nodeSelector: {{reconciler.dev/hostname: '{hostname}'}}}}"
            ),
            job_yaml("named", f"command: ['true']\nplacement: {{nodeName: {local_node_name()}}}"),
        ),
    )
    result = env.up(manifest, timeout="30s")
    assert result.code == 0, result.stderr
    jobs = env.jobs()
    for name in ("selected", "named"):
        assert jobs[name]["status"]["outcome"] == "Succeeded"
        assert jobs[name]["status"]["nodeName"] == local_node_name()
        assert jobs[name]["status"]["runs"][0]["node"] == local_node_name()
