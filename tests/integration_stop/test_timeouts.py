"""Timeouts (API.md section 2): `runTimeout` ends one run (retried only with `onTimeout`),
`timeout` ends the whole job wherever it is (never retried); ending a run is SIGTERM to
its process group, SIGKILL after `stopGracePeriod`, and the job is not Completed while a
process of the run is alive. Real controller, real processes, real SQLite."""

from __future__ import annotations

import time

from reconciler.api.meta import to_epoch
from tests.crash.harness import Pid, group_members, job, read_pids

FAST_STOP = {"stopGracePeriod": "1s"}


def phases_while_alive(env, name: str, proc: Pid, timeout: float = 30) -> set[str]:
    """Poll the job until `proc` is gone; the job must never be Completed meanwhile.
    Returns the phases seen while the process was alive."""
    seen = set()
    deadline = time.monotonic() + timeout
    while True:
        status = env.status(name)
        if not proc.alive():  # checked after reading the status: alive now means alive then
            return seen
        assert status["phase"] != "Completed", f"{name} Completed while pid {proc.pid} is alive: {status}"
        seen.add(status["phase"])
        assert time.monotonic() < deadline, f"pid {proc.pid} still alive after {timeout}s: {status}"
        time.sleep(0.01)  # polling interval, not synchronisation


def assert_timed_out_run(env, name: str, run: dict, reason: str) -> None:
    assert run["outcome"] == "TimedOut", run
    assert run["exitCode"] == -1, run
    assert run.get("reason") == reason, run
    assert run.get("finishedAt"), run
    stderr = (env.run_dir(name, run["number"]) / "stderr").read_text()
    assert stderr.splitlines()[-1] == "job timed out", stderr
    assert group_members(run["pid"]) == [], f"run {run['number']} of {name} left processes in its group"


def test_run_timeout_ends_the_run_and_retries_only_with_on_timeout(env, controller):
    backoff = {"policy": "constant", "delay": "100ms"}
    env.apply(
        job("not-retried", "sleep 30", runTimeout="1s", retry={"limit": 2, "backoff": backoff}, **FAST_STOP),
        job(
            "retried",
            "sleep 30",
            runTimeout="1s",
            retry={"limit": 1, "onTimeout": True, "backoff": backoff},
            **FAST_STOP,
        ),
    )
    done = env.wait_completed(["not-retried", "retried"])

    once = done["not-retried"]
    assert (once["outcome"], once["reason"]) == ("TimedOut", "RunTimeout")
    assert [r["number"] for r in once["runs"]] == [1], "a run timeout without onTimeout is not retried"
    assert_timed_out_run(env, "not-retried", once["runs"][0], "RunTimeout")

    twice = done["retried"]
    # its retries used up: the job's reason says so (each run's says RunTimeout), unlike once's
    assert (twice["outcome"], twice["reason"]) == ("TimedOut", "BackoffLimitExceeded")
    assert [r["number"] for r in twice["runs"]] == [1, 2], "onTimeout: one retry, then the limit is reached"
    for run in twice["runs"]:
        assert_timed_out_run(env, "retried", run, "RunTimeout")

    # the CLI reports the same
    printed = env.get_json("retried")["status"]
    shown = (printed["phase"], printed["outcome"], printed["reason"])
    assert shown == ("Completed", "TimedOut", "BackoffLimitExceeded")
    assert [r["exitCode"] for r in printed["runs"]] == [-1, -1]
    assert env.admissions() == [] and env.queue() == []


def test_job_timeout_ends_the_job_running_waiting_or_in_backoff(env, controller, tmp_path):
    retry_everything = {"limit": 5, "onTimeout": True, "backoff": {"policy": "constant", "delay": "30s"}}
    env.apply(
        job("deadline-running", "sleep 30", timeout="3s", retry=retry_everything, **FAST_STOP),
        job(
            "deadline-waiting",
            "exit 0",
            timeout="1s",
            retry=retry_everything,
            waitFor={"conditions": [{"path": str(tmp_path / "never-created")}]},
        ),
        # Backoff from its run's failure until its deadline: long enough for a poll to see it
        job("deadline-backoff", "exit 1", timeout="4s", retry=retry_everything),
    )
    env.wait_running("deadline-running")
    retry_at = env.wait_phase("deadline-backoff", "Backoff")["nextRunAt"]
    done = env.wait_completed(["deadline-running", "deadline-waiting", "deadline-backoff"])
    # at its deadline (4s after acceptance), not when its retry was due (30s after the run)
    assert to_epoch(done["deadline-backoff"]["completionTime"]) < to_epoch(retry_at), done["deadline-backoff"]

    for name, status in done.items():
        assert (status["outcome"], status["reason"]) == ("TimedOut", "DeadlineExceeded"), (name, status)

    running = done["deadline-running"]
    assert [r["number"] for r in running["runs"]] == [1], "a job timeout is never retried"
    assert_timed_out_run(env, "deadline-running", running["runs"][0], "DeadlineExceeded")

    assert done["deadline-waiting"].get("runs", []) == [], "a job that times out while waiting never runs"

    backoff = done["deadline-backoff"]
    assert [(r["number"], r["outcome"], r["exitCode"]) for r in backoff["runs"]] == [(1, "Failed", 1)]
    assert env.admissions() == [] and env.queue() == []


def test_the_job_timeout_does_not_count_the_time_suspended(env, controller):
    """As a suspended Kubernetes Job's deadline: the clock stops while the job is Suspended and
    goes on from where it stopped when it is resumed (a job stored suspended starts it then)."""
    env.apply(
        job("parked", "true", suspend=True, timeout="2s"),
        job("clock", "sleep 3"),  # outlives parked's timeout: time has passed once it ends
    )
    env.wait_completed(["clock"])
    parked = env.status("parked")
    assert (parked["phase"], parked["outcome"]) == ("Suspended", None), parked
    assert parked["suspendedAt"] == parked["acceptedAt"]
    assert "Suspended Since:" in env.cli("describe", "job", "parked").stdout
    env.cli("resume", "job/parked")
    done = env.wait_completed(["parked"])["parked"]
    assert (done["outcome"], done["reason"]) == ("Succeeded", "Succeeded"), done
    assert done["suspendedSeconds"] >= 3 and "suspendedAt" not in done
    described = env.cli("describe", "job", "parked").stdout
    assert "Time Suspended:" in described and "Suspended Since:" not in described


def test_command_ignoring_sigterm_is_killed_after_the_grace_period(env, controller, tmp_path):
    pidfile = tmp_path / "stubborn.pid"
    # `exec`: the process that ignores TERM (inherited SIG_IGN) is the long-running sleep
    # Stopping for its grace period: 3 s, so that a poll sees it even on a loaded machine
    stubborn = job(
        "stubborn", f"echo $$ > {pidfile}; trap '' TERM; exec sleep 60", runTimeout="1s", stopGracePeriod="3s"
    )
    env.apply(stubborn)
    [sleeper] = read_pids(pidfile, 1)
    env.wait_phase("stubborn", "Stopping")
    # SIGTERM has been sent (it precedes the Stopping write); as long as the process lives,
    # the job must not be Completed
    phases = phases_while_alive(env, "stubborn", sleeper)
    assert "Stopping" in phases
    status = env.wait_phase("stubborn", "Completed")
    assert not sleeper.alive()
    assert (status["outcome"], status["reason"]) == ("TimedOut", "RunTimeout")
    [run] = status["runs"]
    assert_timed_out_run(env, "stubborn", run, "RunTimeout")
    # it was SIGKILLed (128 + 9 as the wrapper saw it), after a Killing event, not TERMinated
    assert (env.run_dir("stubborn", 1) / "exit").read_text().strip() == "137"
    reasons = [e.reason for e in env.events("stubborn")]
    assert "Killing" in reasons, reasons
    assert reasons.index("RunTimeout") < reasons.index("Killing")


def test_grandchildren_die_on_timeout(env, controller, tmp_path):
    pids = tmp_path / "tree.pids"
    # runTimeout leaves the test time to identify the tree (pid + start time) while it is alive
    env.apply(
        job(
            "tree",
            f"sleep 60 & echo $! >> {pids}; sleep 60 & echo $! >> {pids}; echo $$ >> {pids}; wait",
            runTimeout="2s",
            **FAST_STOP,
        )
    )
    tree = read_pids(pids, 3)
    status = env.wait_phase("tree", "Completed")
    assert [p for p in tree if p.alive()] == [], "the job completed while part of its process tree is alive"
    assert (status["outcome"], status["reason"]) == ("TimedOut", "RunTimeout")
    assert_timed_out_run(env, "tree", status["runs"][0], "RunTimeout")


def test_processes_left_behind_by_a_finished_command_are_stopped_before_completion(env, controller, tmp_path):
    """The command exits 0 but leaves a TERM-ignoring process in its group: the job is not
    Completed until that process is gone (SIGTERM, then SIGKILL after the grace period),
    and the run keeps the command's own exit code."""
    pidfile = tmp_path / "leftover.pid"
    env.apply(job("leaves-one", f"(trap '' TERM; exec sleep 60) & echo $! > {pidfile}; exit 0", stopGracePeriod="2s"))
    [leftover] = read_pids(pidfile, 1)
    phases_while_alive(env, "leaves-one", leftover)
    status = env.wait_phase("leaves-one", "Completed")
    assert not leftover.alive()
    assert (status["outcome"], status["reason"]) == ("Succeeded", "Succeeded")
    [run] = status["runs"]
    assert (run["outcome"], run["exitCode"]) == ("Succeeded", 0), run
    assert group_members(run["pid"]) == []
