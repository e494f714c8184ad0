"""spec.resources held by the kernel: a run's cgroup on this machine's real hierarchy (v1
here), its memory limit (OOMKilled from the cgroup's count), its CPU quota, its usage in
the run's record, and its removal when the run ends."""

from __future__ import annotations

import sys

import pytest

from reconciler.api.meta import to_epoch
from tests.crash.harness import Env, job
from tests.resources.conftest import hierarchy, run_cgroup_dirs

pytestmark = pytest.mark.skipif(hierarchy() is None, reason="needs a cgroup hierarchy (the CI machine has v1)")

ALLOCATE = f"{sys.executable} -c 'b = bytearray(300 * 1024 * 1024); b[::4096] = b\"x\" * len(b[::4096])'"


def test_a_run_past_its_memory_limit_ends_failed_oom_killed(env: Env):
    env.start_controller()
    env.apply(job("hog", ALLOCATE, resources={"memory": "64Mi"}))
    status = env.wait_phase("hog", "Completed", timeout=60)
    run = status["runs"][0]
    assert (status["outcome"], status["reason"]) == ("Failed", "OOMKilled"), status
    assert (run["outcome"], run["reason"], run["exitCode"]) == ("Failed", "OOMKilled", 137)
    assert run["limits"] == f"cgroup {hierarchy().version}"
    assert 0 < run["peakMemory"] <= 64 * 1024 * 1024
    assert not run_cgroup_dirs(hierarchy(), env.obj("hog").uid), "the run's cgroup outlived it"


def test_the_same_allocation_within_the_limit_succeeds(env: Env):
    env.start_controller()
    env.apply(job("fits", ALLOCATE, resources={"memory": "512Mi"}))
    status = env.wait_phase("fits", "Completed", timeout=60)
    run = status["runs"][0]
    assert status["outcome"] == "Succeeded", status
    assert run["peakMemory"] >= 300 * 1024 * 1024
    assert run["cpuSeconds"] > 0


def test_a_busy_loop_under_a_fifth_of_a_cpu_gets_about_that(env: Env):
    env.start_controller()
    env.apply(job("spin", "timeout 3 sh -c 'while :; do :; done'; exit 0", resources={"cpu": "0.2"}))
    status = env.wait_phase("spin", "Completed", timeout=60)
    run = status["runs"][0]
    wall = to_epoch(run["finishedAt"]) - to_epoch(run["startedAt"])
    share = run["cpuSeconds"] / wall
    assert status["outcome"] == "Succeeded", status
    assert 0.05 < share < 0.45, f"{run['cpuSeconds']} CPU seconds over {wall:.2f}s of wall time"
