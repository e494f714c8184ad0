"""Where no cgroup can be made (no hierarchy, or one that refuses the run's cgroup), a run
still runs: memory becomes an address-space rlimit, and the job's LimitsEnforced condition
says the limits are degraded. The agent is pointed at such a place by RECONCILER_CGROUP_ROOT."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.crash.harness import Env, job

ALLOCATE = f"{sys.executable} -c 'b = bytearray(300 * 1024 * 1024)'"


def unwritable_v2(root: Path) -> Path:
    """A cgroup v2 hierarchy offering memory and cpu in which `reconciler/` cannot be made:
    a file stands in its place (root is not refused by permissions, so this is how a
    read-only hierarchy is shown here)."""
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "reconciler").write_text("")
    return root


@pytest.mark.parametrize("where", ["no-hierarchy", "read-only"])
def test_without_a_cgroup_memory_is_an_rlimit_and_the_run_says_so(env: Env, monkeypatch, tmp_path, where):
    root = tmp_path / "empty" if where == "no-hierarchy" else unwritable_v2(tmp_path / "v2")
    root.mkdir(exist_ok=True)
    monkeypatch.setenv("RECONCILER_CGROUP_ROOT", str(root))
    env.start_controller()
    env.apply(job("hog", ALLOCATE, resources={"memory": "128Mi"}), job("small", "true", resources={"memory": "128Mi"}))
    statuses = env.wait_completed(["hog", "small"], timeout=60)
    hog, small = statuses["hog"], statuses["small"]
    assert small["outcome"] == "Succeeded", "a degraded limit must never fail a run that keeps within it"
    assert hog["outcome"] == "Failed" and hog["reason"] != "OOMKilled", hog  # a MemoryError, not the kernel
    assert "MemoryError" in (env.run_dir("hog", 1) / "stderr").read_text()
    for status in (hog, small):
        run = status["runs"][0]
        assert run["limits"] == "rlimit" and "cgroup" not in run
        condition = next(c for c in status["conditions"] if c["type"] == "LimitsEnforced")
        assert (condition["status"], condition["reason"]) == ("False", "LimitsDegraded")
        assert str(root) in condition["message"]
