"""spec.resources held by the kernel: a run's cgroup on this machine's real hierarchy (v1
here), its memory limit (OOMKilled from the cgroup's count), its CPU quota, its usage in
the run's record, and its removal when the run ends."""

from __future__ import annotations

import os
import sys

import pytest

from reconciler.api.meta import to_epoch
from tests.crash.harness import Env, job, pool, read_pids
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
    described = env.cli("describe", "job", "fits").stdout
    header = next(line for line in described.splitlines() if "PEAK MEMORY" in line)
    assert "CPU SECONDS" in header and "LIMITS" in header
    row = next(line for line in described.splitlines() if "Succeeded" in line and "cgroup" in line)
    assert f"{run['peakMemory'] / 2**20:.1f}Mi" in row and f"{run['cpuSeconds']:.2f}" in row


def test_a_busy_loop_under_a_fifth_of_a_cpu_gets_about_that(env: Env):
    env.start_controller()
    env.apply(job("spin", "timeout 3 sh -c 'while :; do :; done'; exit 0", resources={"cpu": "0.2"}))
    status = env.wait_phase("spin", "Completed", timeout=60)
    run = status["runs"][0]
    wall = to_epoch(run["finishedAt"]) - to_epoch(run["startedAt"])
    share = run["cpuSeconds"] / wall
    assert status["outcome"] == "Succeeded", status
    assert 0.05 < share < 0.45, f"{run['cpuSeconds']} CPU seconds over {wall:.2f}s of wall time"


def test_an_adopted_run_keeps_its_cgroup_across_a_controller_restart(env: Env):
    go, pid_file = env.work / "go", env.work / "pid"
    shell = f"echo $$ > {pid_file}; while [ ! -e {go} ]; do sleep 0.05; done; {ALLOCATE}"
    first = env.start_controller()
    env.apply(job("kept", shell, resources={"memory": "64Mi"}))
    run = env.wait_running("kept")["runs"][0]
    first.kill()  # SIGKILL, as a crash: the run goes on, in its cgroup
    env.start_controller()
    command = read_pids(pid_file, 1)[0]
    group = hierarchy().open(run["cgroup"])
    assert command.pid in group.pids()
    assert env.wait_status("kept", lambda s: s["runs"][0].get("pid") == run["pid"] and s["phase"] == "Running")
    go.touch()
    status = env.wait_phase("kept", "Completed", timeout=60)
    assert (status["outcome"], status["reason"]) == ("Failed", "OOMKilled"), "the adopted run was not limited"
    assert status["runs"][0]["cgroup"] == run["cgroup"]
    assert not group.exists(), "the adopted run's cgroup outlived it"


# a process that leaves the run's process group and ignores SIGTERM; the command goes on
# once it has written its pid (so a stop cannot reach it before its trap is set)
ESCAPEE = "setsid sh -c 'trap \"\" TERM; echo $$ > {pid}; exec sleep 1000' & while [ ! -s {pid} ]; do sleep 0.01; done;"


@pytest.mark.parametrize(
    ("stop", "spec", "outcome"),
    [
        pytest.param("cancel", {}, "Cancelled", id="cancel"),
        pytest.param(None, {"runTimeout": "1s"}, "TimedOut", id="runTimeout"),
        pytest.param(None, {"timeout": "2s"}, "TimedOut", id="job-timeout"),
    ],
)
def test_stopping_a_run_kills_a_process_that_left_its_group(env: Env, stop, spec, outcome):
    pid_file = env.work / "escapee"
    env.start_controller()
    shell = ESCAPEE.format(pid=pid_file) + " sleep 1000"
    env.apply(job("esc", shell, stopGracePeriod="500ms", **spec))
    wrapper = env.wait_running("esc")["runs"][0]["pid"]
    escapee = read_pids(pid_file, 1)[0]
    assert os.getpgid(escapee.pid) != wrapper, "the escapee did not leave the run's process group"
    if stop == "cancel":
        env.cli("cancel", "esc")
    status = env.wait_phase("esc", "Completed", timeout=30)
    assert status["outcome"] == outcome, status
    assert not escapee.alive(), "a process of the run outlived its stop"


def test_the_slot_is_held_until_every_process_of_the_run_is_gone(env: Env):
    """A command that exits leaving a setsid'd process that ignores SIGTERM: with one slot,
    the next job starts only after that process was killed (the next job looks itself)."""
    pid_file, seen = env.work / "escapee", env.work / "seen"
    env.start_controller()
    env.apply(pool("one", 1))
    env.apply(job("first", ESCAPEE.format(pid=pid_file) + " exit 0", pool="one", stopGracePeriod="500ms"))
    escapee = read_pids(pid_file, 1)[0]
    look = f"s=$(cut -d' ' -f3 /proc/{escapee.pid}/stat 2>/dev/null); echo \"state=$s\" > {seen}"
    env.apply(job("second", look, pool="one"))
    statuses = env.wait_completed(["first", "second"], timeout=30)
    assert statuses["first"]["outcome"] == "Succeeded", statuses["first"]
    assert seen.read_text().strip() in ("state=", "state=Z"), "the next job started beside the escapee"
    assert not escapee.alive()
    first_end = to_epoch(statuses["first"]["runs"][0]["finishedAt"])
    assert to_epoch(statuses["second"]["runs"][0]["startedAt"]) >= first_end
