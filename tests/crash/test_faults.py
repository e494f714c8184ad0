"""Crash safety with fault injection (API.md section 2, Crash safety): a controller armed
with RECONCILER_FAULT=<point> SIGKILLs itself at that point; a normal controller started
afterwards must bring every job to exactly what an uninterrupted run gives (outcomes, run
counts, exit codes), no job may ever have two live runs, and no slot or queue row may be
left behind."""

from __future__ import annotations

import signal

import pytest

from reconciler.controller.faults import KILLS, RAISES
from tests.crash.harness import Env, intervals, job, marked, marker_runs, max_overlap

NAMES = ["quick", "flaky", "after-both", "fails"]


def pipeline(markers) -> list[dict]:
    """A short run, one that fails once then succeeds (retry limit 1, backoff 1s), a job
    depending on both, and one that fails with a code of its own (no retry)."""
    once = {"limit": 1, "backoff": {"policy": "constant", "delay": "1s"}}
    return [
        job("quick", marked(markers, "sleep 0.5")),
        job("flaky", marked(markers, 'sleep 0.3; [ "$RECONCILER_RUN" != 1 ]'), retry=once),
        job("after-both", marked(markers, "sleep 0.2"), dependsOn=["quick", "flaky"]),
        job("fails", marked(markers, "sleep 0.3; exit 3")),
    ]


def summary(statuses: dict[str, dict]) -> dict[str, tuple]:
    """What must not depend on crashes: outcome, reason and every run's (number, outcome,
    exit code, reason)."""
    return {
        name: (
            s.get("outcome"),
            s.get("reason"),
            [(r["number"], r.get("outcome"), r.get("exitCode"), r.get("reason")) for r in s.get("runs", [])],
        )
        for name, s in statuses.items()
    }


def assert_clean_history(env: Env, statuses: dict[str, dict], markers) -> None:
    """No job ever had two runs alive at once, by the status records and by the runs'
    own markers; every recorded run started exactly once; nothing is left held or queued."""
    seen = marker_runs(markers)  # asserts no overlap and no run number started twice
    for name, status in statuses.items():
        assert max_overlap(intervals(status)) <= 1, f"{name}: overlapping runs in status: {status['runs']}"
        recorded = [r["number"] for r in status.get("runs", [])]
        assert [run for run, _, _ in seen.get(name, [])] == recorded, (name, seen.get(name), recorded)
        assert all(end is not None for _, _, end in seen.get(name, [])), f"{name}: a run never ended: {seen[name]}"
        assert all(r.get("finishedAt") for r in status.get("runs", [])), status["runs"]
    assert env.admissions() == [], [(a.job_name, a.run_number, a.owner) for a in env.admissions()]
    assert env.queue() == [], [q.job_name for q in env.queue()]
    controllers = {c.pid for c in env.controllers}
    left = [p.pid for p in env.run_processes() if p.pid not in controllers]
    assert left == [], f"processes still alive after every job completed: {left}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, tuple]:
    """The same pipeline, run once without any fault."""
    root = tmp_path_factory.mktemp("reference")
    env = Env(root)
    try:
        markers = root / "markers"
        env.apply(*pipeline(markers))
        env.start_controller()
        statuses = env.wait_completed(NAMES)
        assert_clean_history(env, statuses, markers)
        expected = summary(statuses)
        # the pipeline exercises what it should: a retry after exit 1, a plain failure
        assert expected["flaky"][0] == "Succeeded" and [r[2] for r in expected["flaky"][2]] == [1, 0]
        assert expected["fails"][0] == "Failed" and [r[2] for r in expected["fails"][2]] == [3]
        assert expected["quick"][0] == expected["after-both"][0] == "Succeeded"
        return expected
    finally:
        env.close()


def crash_window(env: Env, point: str) -> str:
    """What the store shows right after the crash: proof that the fault hit where it says."""
    statuses = {n: env.status(n) for n in NAMES}
    held = {a.job_name: a for a in env.admissions()}
    if point in ("after-admission", "after-spawn"):
        # admitted and claimed, no run recorded yet
        starting = [
            n
            for n, s in statuses.items()
            if s.get("phase") == "Starting"
            and n in held
            and held[n].owner is not None
            and not any(r["number"] == held[n].run_number for r in s.get("runs", []))
        ]
        assert starting, (statuses, held)
        spawned = [n for n in starting if (env.run_dir(n, held[n].run_number) / "stdout").exists()]
        if point == "after-admission":
            assert not spawned, f"the run of {spawned} was spawned before the after-admission fault"
        else:
            assert spawned, f"no run was spawned before the after-spawn fault: {starting}"
        return starting[0]
    if point == "before-exit-record":
        # a run whose processes ended, still open in status
        open_runs = [
            n
            for n, s in statuses.items()
            if s.get("phase") in ("Running", "Stopping") and s["runs"] and s["runs"][-1].get("finishedAt") is None
        ]
        assert open_runs, statuses
        return open_runs[0]
    if point == "after-completion":
        # a completion written (with its outbox rows), nothing after it
        completed = [n for n, s in statuses.items() if s.get("phase") == "Completed"]
        assert len(completed) == 1, statuses
        return completed[0]
    assert point == "during-backoff"
    assert statuses["flaky"]["phase"] == "Backoff", statuses["flaky"]
    return "flaky"


@pytest.mark.parametrize("point", KILLS)
def test_restart_after_fault_converges_like_an_uninterrupted_run(env, reference, point):
    markers = env.root / "markers"
    env.apply(*pipeline(markers))
    faulty = env.start_controller(point, ready=False)
    assert faulty.wait_exit() == -signal.SIGKILL, f"the controller did not die at {point}:\n{faulty.log()}"
    crash_window(env, point)

    env.start_controller()
    statuses = env.wait_completed(NAMES)
    assert summary(statuses) == reference
    assert_clean_history(env, statuses, markers)


@pytest.mark.parametrize("point", RAISES)
def test_a_thread_that_dies_ends_the_controller_and_a_restart_converges(env, reference, point):
    """A reconcile worker or the change watcher dying of an error must not leave a process
    that heartbeats and reconciles nothing: it exits non-zero with one line saying why (a
    supervisor restarts it), and the restarted controller converges as if nothing happened."""
    markers = env.root / "markers"
    env.apply(*pipeline(markers))
    faulty = env.start_controller(point, ready=False)
    assert faulty.wait_exit() == 1, f"the controller did not exit at {point}:\n{faulty.log()}"
    thread = "reconcile-0" if point == "worker-dies" else "change-watcher"
    assert f"thread {thread} died (InjectedFault: fault injected at {point})" in faulty.log()

    env.start_controller()
    statuses = env.wait_completed(NAMES)
    assert summary(statuses) == reference
    assert_clean_history(env, statuses, markers)
