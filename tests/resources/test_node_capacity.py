"""Node capacity in cpu and memory: counted with slots where a node declares them; the node a
controller registers for its host declares slots only."""

from __future__ import annotations

import json

from reconciler.controller.nodes import heartbeat, local_node_name
from reconciler.store import Store
from reconciler.store import repository as repo
from tests.crash.harness import API, Env, job, marked, marker_runs, max_overlap


def test_a_node_with_two_cpus_runs_two_one_cpu_jobs_at_once_not_three(env: Env):
    env.apply(
        {
            "apiVersion": API,
            "kind": "Node",
            "metadata": {"name": local_node_name()},
            "spec": {"capacity": {"slots": 8, "cpu": "2"}},
        }
    )
    go, markers = env.work / "go", env.work / "markers"
    hold = marked(markers, f"while [ ! -e {go} ]; do sleep 0.05; done")
    env.start_controller()
    env.apply(*(job(f"j{i}", hold, resources={"cpu": "1"}) for i in range(3)))
    env.wait_status(
        "j0",
        lambda _: sum(env.status(f"j{i}").get("phase") == "Running" for i in range(3)) == 2,
        message="two jobs running",
    )
    waiting = next(env.status(f"j{i}") for i in range(3) if env.status(f"j{i}").get("phase") != "Running")
    assert waiting["phase"] == "Queued" and waiting["reason"] == "Unschedulable", waiting
    assert "insufficient cpu" in waiting["message"]
    node = json.loads(env.cli("get", "node", local_node_name(), "-o", "json").stdout)
    assert node["status"]["allocated"] == {"slots": 2, "cpu": "2"}
    go.touch()
    statuses = env.wait_completed([f"j{i}" for i in range(3)])
    assert all(s["outcome"] == "Succeeded" for s in statuses.values())
    # as the runs saw it: a record's times are its steps', not its process's
    spans = [(start, end) for runs in marker_runs(markers).values() for _, start, end in runs if end is not None]
    assert len(spans) == 3 and max_overlap(spans) == 2, spans


def test_the_local_node_declares_slots_only_so_a_service_does_not_take_the_host_whole(tmp_path):
    """The node a controller registers for its host counts slots only: with cpu declared,
    a service's default 2 CPUs would hold back every other job on a 2-core host."""
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        heartbeat(store, "here", "owner", 0.0)
        with store.read() as session:
            node = repo.get(session, kind="Node", name="here")
        assert node is not None
        assert node.spec["capacity"] == {}
    finally:
        store.dispose()
