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


def test_a_job_without_a_node_runs_once_the_node_registers_again(sqlite_url, tmp_path, monkeypatch):
    """The node's re-registration (here after its Node was deleted) is a write of the
    controller's own process, which its change feed skips: the jobs queued as
    Unschedulable meanwhile must be woken by the heartbeat itself, not by the safety poll
    minutes later."""
    from pathlib import Path

    from reconciler.apply import apply_manifests, delete
    from reconciler.controller import manager, nodes
    from reconciler.manifests import parse_text
    from reconciler.reads import job_statuses
    from reconciler.store import Store
    from tests.helpers import wait_until

    monkeypatch.setattr(nodes, "HEARTBEAT_INTERVAL", 1.0)  # the job is queued before the node returns
    store, other = Store(sqlite_url), Store(sqlite_url)  # the controller's, and another client's
    controller = manager.Controller(store).start()
    try:
        delete(other, [("Node", controller.node)])  # as the prune of a GitOps folder once did
        manifests, problems = parse_text(job_yaml("homeless", "command: ['true']"), "j.yaml", Path(tmp_path))
        assert not problems
        apply_manifests(other, manifests)
        wait_until(
            lambda: job_statuses(other, ["homeless"])["homeless"].get("outcome") == "Succeeded",
            timeout=15,
            message="the job ran once the node registered again",
        )
    finally:
        controller.stop()
        store.dispose()
        other.dispose()


def test_get_and_describe_agree_on_a_node_whose_heartbeat_went_stale(sqlite_url):
    """describe showed the stored `Ready True` while get said NotReady: both now show the
    node as it stands, Ready Unknown once its agent posted nothing for 40 s."""
    import time

    from reconciler.controller.nodes import heartbeat
    from reconciler.store import Store
    from tests.data.inprocess import cli

    store = Store(sqlite_url)
    try:
        heartbeat(store, "gone", "elsewhere:1:0", time.time() - 300)  # its agent's last word, 5 minutes ago
        heartbeat(store, "here", "elsewhere:2:0", time.time())
    finally:
        store.dispose()
    rows = {line.split()[0]: line.split()[1] for line in cli("get", "nodes", store=sqlite_url).stdout.splitlines()[1:]}
    assert rows == {"gone": "NotReady", "here": "Ready"}
    described = cli("describe", "node", "gone", store=sqlite_url).stdout
    assert "status: Unknown" in described and "NodeStatusUnknown" in described
    assert "status: 'True'" not in described
    (ready,) = json.loads(cli("get", "node", "gone", "-o", "json", store=sqlite_url).stdout)["status"]["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "Unknown", "NodeStatusUnknown")
