"""Prometheus metrics (`controller --metrics-port`): a real controller process serves
/metrics on loopback; gauges are read from the store at scrape time, counters and
histograms follow what the controller did. Parsed with prometheus_client's own parser."""

from __future__ import annotations

import socket

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.crash.harness import job, pool
from tests.helpers import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted labels: value}}."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def test_metrics_follow_jobs_pools_runs_and_nodes(env, tmp_path):
    port = free_port()
    env.start_controller(args=("--metrics-port", str(port)))
    release = tmp_path / "release"
    env.apply(pool("one", 1))
    env.apply(job("holder", f"while [ ! -e {release} ]; do sleep 0.05; done", pool="one"))
    env.wait_running("holder")
    env.apply(
        job("behind", "exit 0", pool="one"), job("gated", "exit 0", waitFor={"conditions": [{"path": str(release)}]})
    )
    env.wait_phase("behind", "Queued")

    during = scrape(port)
    assert during["reconciler_jobs"][(("outcome", ""), ("phase", "Running"))] == 1
    pending = during["reconciler_pending_jobs"]
    assert pending[(("pool", "one"), ("reason", "Queued"))] == 1
    assert pending[(("pool", "global"), ("reason", "Waiting"))] == 1
    slots = during["reconciler_pool_slots"]
    assert slots[(("pool", "one"), ("state", "used"))] == 1 and slots[(("pool", "one"), ("state", "capacity"))] == 1
    assert slots[(("pool", "global"), ("state", "capacity"))] == float("inf")
    assert list(during["reconciler_node_ready"].values()) == [1.0]
    assert "reconciler_workqueue_depth" in during

    release.touch()
    env.apply(job("fails", "exit 3"))
    env.wait_completed(["holder", "behind", "gated", "fails"])
    after = scrape(port)
    jobs = after["reconciler_jobs"]
    assert jobs[(("outcome", "Succeeded"), ("phase", "Completed"))] == 3
    assert jobs[(("outcome", "Failed"), ("phase", "Completed"))] == 1
    assert after.get("reconciler_pending_jobs", {}) == {}
    runs = after["reconciler_runs_total"]
    assert runs[(("outcome", "Succeeded"), ("reason", ""))] == 3 and runs[(("outcome", "Failed"), ("reason", ""))] == 1
    assert after["reconciler_run_duration_seconds_count"][()] == 4
    assert after["reconciler_admission_wait_seconds_count"][()] == 4
    assert after["reconciler_reconcile_duration_seconds_count"][()] > 0


def test_a_port_in_use_is_refused_with_exit_2(env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        c = env.start_controller(args=("--metrics-port", str(port)), ready=False)
        assert c.wait_exit() == 2
        wait_until(lambda: "--metrics-port" in c.log(), 5, message="the error names the flag")
