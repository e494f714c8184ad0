"""Killing the controller while runs are in flight (API.md section 2, Crash safety): a
run that ended while no controller was up gets its real exit code, a run still alive is
adopted (not started again), and a run whose wrapper was killed by someone else
meanwhile, so that its fate cannot be proven, becomes Lost and is retried as `onLost`
says. Also: a stop (grace period, runTimeout) interrupted by the crash is carried out by
the next controller; an adopted run keeps its real start time (its runTimeout counts from
it); and only the wrapper itself is adopted, never a process that merely shares its argv."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from reconciler.agent.wrapper import WRAPPER_NAME
from reconciler.api.meta import to_epoch
from tests.crash.harness import TAG, Pid, group_members, job, read_pids
from tests.helpers import wait_until


def test_exit_codes_of_runs_that_ended_or_lived_on_while_the_controller_was_down(env, tmp_path):
    go = tmp_path / "go"
    env.apply(
        job("ends-meanwhile", "sleep 2; exit 7"),
        job("lives-on", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 7"),
    )
    first = env.start_controller()
    runs = {n: env.wait_running(n)["runs"][0] for n in ("ends-meanwhile", "lives-on")}
    wrappers = {n: Pid(r["pid"], r["processStartTime"]) for n, r in runs.items()}
    first.kill()

    # the first run ends while no controller is up: its wrapper leaves the exit record
    ended = env.run_dir("ends-meanwhile", 1) / "exit"
    wait_until(lambda: ended.exists() and not wrappers["ends-meanwhile"].alive(), 30, message="run ended meanwhile")
    assert ended.read_text().strip() == "7"
    assert env.status("ends-meanwhile")["phase"] == "Running", "nothing records the end while no controller is up"

    restarted_at = time.time()
    env.start_controller()
    assert wrappers["lives-on"].alive()
    go.touch()
    done = env.wait_completed(["ends-meanwhile", "lives-on"])
    for name, status in done.items():
        [run] = status["runs"]  # adopted, never started a second time
        assert (run["number"], run["outcome"], run["exitCode"]) == (1, "Failed", 7), (name, run)
        assert (run["pid"], run["processStartTime"]) == (wrappers[name].pid, wrappers[name].start), (name, run)
        assert status["outcome"] == "Failed", (name, status)
    # the run that ended meanwhile ended when its wrapper wrote its exit, not when it was seen
    [meanwhile] = done["ends-meanwhile"]["runs"]
    finished = to_epoch(meanwhile["finishedAt"])
    assert abs(finished - ended.stat().st_mtime) < 0.001 and finished < restarted_at, meanwhile
    assert env.admissions() == [] and env.queue() == []


def test_a_run_killed_while_the_controller_was_down_is_lost_and_retried_per_on_lost(env):
    body = 'if [ "$RECONCILER_RUN" = 1 ]; then exec sleep 60; fi; exit 0'
    retry = {"limit": 1, "backoff": {"policy": "constant", "delay": "100ms"}}
    env.apply(
        job("lost-retried", body, retry=retry),
        job("lost-final", body, retry={**retry, "onLost": False}),
    )
    first = env.start_controller()
    runs = {n: env.wait_running(n)["runs"][0] for n in ("lost-retried", "lost-final")}
    first.kill()

    # someone else SIGKILLs the whole run, wrapper included: no exit record is ever written
    for run in runs.values():
        os.killpg(run["pid"], signal.SIGKILL)
    for name, run in runs.items():
        wait_until(lambda pid=run["pid"]: group_members(pid) == [], 30, message=f"{name} killed")
        assert not (env.run_dir(name, 1) / "exit").exists()

    env.start_controller()
    done = env.wait_completed(["lost-retried", "lost-final"])

    retried = done["lost-retried"]
    assert [(r["number"], r["outcome"], r.get("exitCode")) for r in retried["runs"]] == [
        (1, "Lost", None),
        (2, "Succeeded", 0),
    ], retried["runs"]
    assert retried["outcome"] == "Succeeded"

    final = done["lost-final"]
    assert [(r["number"], r["outcome"], r.get("exitCode")) for r in final["runs"]] == [(1, "Lost", None)], final["runs"]
    assert final["outcome"] == "Lost", final
    # its node was fine: the job says what its run says, not NodeLost
    assert final["reason"] == final["runs"][-1]["reason"] == "ProcessLost", final
    assert env.admissions() == [] and env.queue() == []


def test_a_stop_interrupted_by_a_crash_is_finished_after_restart(env, tmp_path):
    """Killed during the grace period of a TERM-ignoring run, and while another run's
    runTimeout passes: the next controller still SIGKILLs the first after its grace period
    and times the second out; neither job completes while its process lives."""
    pidfile = tmp_path / "stubborn.pid"
    env.apply(
        job("stubborn", f"echo $$ > {pidfile}; trap '' TERM; exec sleep 60", runTimeout="1s", stopGracePeriod="3s"),
        job("overdue", "sleep 60", runTimeout="3s", stopGracePeriod="1s"),
    )
    first = env.start_controller()
    [sleeper] = read_pids(pidfile, 1)
    overdue = env.wait_running("overdue")["runs"][0]
    stopping = env.wait_phase("stubborn", "Stopping")
    first.kill()  # within stubborn's grace period, before overdue's runTimeout
    assert sleeper.alive(), "SIGTERM is ignored: only the grace period's SIGKILL may end it"

    # while no controller is up, the grace period and the other run's timeout both pass
    kill_at = float(stopping["stop"]["killAt"])
    timeout_at = to_epoch(overdue["startedAt"]) + 3
    wait_until(lambda: time.time() > max(kill_at, timeout_at), 30, message="deadlines passed")
    assert sleeper.alive() and env.status("stubborn")["phase"] == "Stopping"
    assert env.status("overdue")["phase"] == "Running"

    env.start_controller()
    done = env.wait_completed(["stubborn", "overdue"])
    assert not sleeper.alive()
    assert group_members(overdue["pid"]) == []
    for name, status in done.items():
        assert (status["outcome"], status["reason"]) == ("TimedOut", "RunTimeout"), (name, status)
        [run] = status["runs"]
        assert (run["outcome"], run["exitCode"]) == ("TimedOut", -1), (name, run)
        assert (env.run_dir(name, 1) / "stderr").read_text().splitlines()[-1] == "job timed out"
    assert (env.run_dir("stubborn", 1) / "exit").read_text().strip() == "137"
    assert env.admissions() == [] and env.queue() == []


def test_a_run_adopted_after_a_crash_keeps_its_real_start_time(env):
    """Spawned, then the controller died before recording the run (after-spawn). The run's
    startedAt, and so its runTimeout, count from when the process started, not from
    when a controller came back and adopted it."""
    env.apply(job("adopted", "sleep 60", runTimeout="2s", stopGracePeriod="1s"))
    faulty = env.start_controller("after-spawn", ready=False)
    assert faulty.wait_exit() == -signal.SIGKILL, faulty.log()
    wrapper = wait_until(lambda: env.wrapper_of("adopted", 1), 10, message="the spawned wrapper")
    assert env.status("adopted").get("runs", []) == [], "the fault hits before the run is recorded"
    # the controller is away for longer than the run may last
    wait_until(lambda: time.time() > wrapper.start + 2, 30, message="runTimeout passed since the process started")

    env.start_controller()
    running = env.wait_status("adopted", lambda s: bool(s.get("runs")))
    [run] = running["runs"]
    assert (run["pid"], run["processStartTime"]) == (wrapper.pid, wrapper.start), "adopted, not started again"
    assert to_epoch(run["startedAt"]) - wrapper.start < 1.0, (
        f"startedAt {run['startedAt']} is when it was adopted, not when it started ({wrapper.start})"
    )
    status = env.wait_phase("adopted", "Completed")
    assert (status["outcome"], status["reason"]) == ("TimedOut", "RunTimeout")
    assert not wrapper.alive()


def test_only_the_wrapper_itself_is_adopted_not_a_process_that_shares_its_argv(env, tmp_path):
    """A forked child of the wrapper (before it execs `mv`, or the command) carries the
    wrapper's argv for a moment, but not its process group: adoption must take only the
    group leader. Here a process with the wrapper's argv that does not lead its own group
    is standing when a controller restarts after an after-admission crash."""
    out = tmp_path / "ran"
    env.apply(job("real", f"echo yes > {out}"))
    faulty = env.start_controller("after-admission", ready=False)
    assert faulty.wait_exit() == -signal.SIGKILL, faulty.log()
    run_dir = env.run_dir("real", 1)
    run_dir.mkdir(parents=True)
    lookalike = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 60", WRAPPER_NAME, str(run_dir.resolve()), "0", "/bin/true"],
        env={**os.environ, TAG: str(env.root)},
    )  # same argv, our process group
    try:
        env.start_controller()
        status = env.wait_phase("real", "Completed")
        assert status["outcome"] == "Succeeded", status
        [run] = status["runs"]
        assert run["pid"] != lookalike.pid, "a process that is not a run wrapper was adopted as the run"
        assert out.read_text().strip() == "yes"
    finally:
        lookalike.kill()
        lookalike.wait()


def test_a_probe_left_running_by_a_killed_controller_is_killed_by_the_next(env, tmp_path):
    """A wait probe leads its own session, which only its controller kills (timeout, close):
    a controller killed with kill -9 leaves it, and the next controller kills it at start
    rather than let it run unbounded beside its own probe of the same condition."""
    pids = tmp_path / "probe.pids"
    probe = {"command": ["sh", "-c", f"echo $$ >> {pids}; exec sleep 300"], "timeout": "10m", "interval": "1s"}
    env.apply(job("gated", "true", waitFor={"conditions": [{"probe": probe}]}))
    first = env.start_controller()
    [orphan] = read_pids(pids, 1)
    first.kill()
    assert orphan.alive(), "nothing kills the probe while no controller runs"
    env.start_controller()
    wait_until(lambda: not orphan.alive(), 30, message="the orphaned probe killed")
    wait_until(lambda: len(pids.read_text().split()) >= 2, 30, message="the new controller's own probe")
    assert env.status("gated")["phase"] == "Waiting"
