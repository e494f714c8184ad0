"""A run whose start through the fork server is not known (the request written, no reply:
ForkServerUnsure) keeps the cgroup made for it, for the run may exist. When the job then
stops (cancelled) or its node is drained with --force before any run started, the next step
finds no run and removes that cgroup (RunSteps._unused_cgroup): it is not left behind.

The fork server is made to stay silent by stopping it (SIGSTOP): the controller writes the
request, gets no reply within the fork server's bound (ANSWER_TIMEOUT, 10 s, in the
controller's process: not shortened here) and ends the server. The stop is written while
the request is unanswered, so the step that follows the failed one finds it. That the agent
keeps the cgroup through ForkServerUnsure is not seen here (that step comes milliseconds
later); tests/agent/test_agent_forkserver.py holds the agent to it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psutil
import pytest

from reconciler.agent.wrapper import WRAPPER_NAME
from reconciler.api.annotations import LOST_RUN
from reconciler.controller.nodes import local_node_name
from tests.crash.harness import TAG, Env, job
from tests.helpers import wait_until
from tests.resources.conftest import hierarchy, run_cgroup_dirs

pytestmark = pytest.mark.skipif(hierarchy() is None, reason="needs a cgroup hierarchy (the CI machine has v1)")


def fork_server(env: Env) -> psutil.Process | None:
    """The run fork server of the test's live controller, if it has started one."""
    controllers = {c.pid for c in env.controllers if c.proc.poll() is None}
    for proc in env.tagged_processes():
        with contextlib.suppress(psutil.NoSuchProcess):
            cmd = proc.cmdline()
            if len(cmd) > 3 and cmd[3] == f"{WRAPPER_NAME}-server" and proc.ppid() in controllers:
                return proc
    return None


def started_server(env: Env) -> psutil.Process:
    """Runs until the controller starts them through its fork server: the C wrapper is built
    (or taken from the user's cache) in a thread, and runs use the sh wrapper until then."""
    warmed = 0

    def up() -> psutil.Process | None:
        nonlocal warmed
        found = fork_server(env)
        if found is None:
            warmed += 1
            env.apply(job(f"warm-{warmed}", "true"))
            env.wait_phase(f"warm-{warmed}", "Completed")
        return found

    return wait_until(up, timeout=150, interval=0.05, message="the controller's run fork server")


@pytest.mark.parametrize("stop", ["cancel", "drain"])
def test_the_cgroup_kept_for_an_unanswered_start_is_removed_when_the_job_stops_unstarted(env: Env, stop):
    hier = hierarchy()
    assert hier is not None
    controller = env.start_controller()
    server = started_server(env)
    server.suspend()  # SIGSTOP: it reads no request and answers none (SIGKILL at teardown, if left)
    drain: subprocess.Popen[str] | None = None
    env.apply(job("unsure", "echo started; exit 0"))
    uid = env.obj("unsure").uid
    # made in LocalAgent.start after the step found no reason to stop: the request follows
    # in every hierarchy: a spare becomes the run's by one rename in each, one after another
    made = wait_until(
        lambda: len(dirs := run_cgroup_dirs(hier, uid)) == len(hier.parents()) and dirs,
        message="the run's cgroup, made for its start",
    )
    assert all(d.name == f"unsure.{uid}.1" for d in made), made
    if stop == "cancel":
        env.cli("cancel", "unsure")
    else:
        drain = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "drain", "--force", f"node/{local_node_name()}"],
            env={**os.environ, "RECONCILER_STORE": env.url, TAG: str(env.root)},  # killed at teardown if left
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_until(lambda: LOST_RUN in env.obj("unsure").annotations, message="drain --force's request")
    # the stop is written while the start is unanswered: the run may yet be forked into
    # its cgroup, which stays
    assert server.is_running() and server.status() == psutil.STATUS_STOPPED, "the server answered meanwhile"
    assert run_cgroup_dirs(hier, uid) == made, "the cgroup went while the start was unanswered"
    assert env.status("unsure")["phase"] == "Starting"

    wait_until(lambda: not server.is_running(), timeout=30, message="the silent server ended by the controller")
    if stop == "cancel":
        status = env.wait_phase("unsure", "Completed", timeout=30)
        assert (status["outcome"], status["reason"]) == ("Cancelled", "Cancelled"), status
    else:
        assert drain is not None
        out, _ = drain.communicate(timeout=60)
        assert drain.returncode == 0, out
        status = env.wait_phase("unsure", "Queued", timeout=30)
        said = [e.message for e in env.events("unsure") if e.reason == "NodeDrained"]
        assert any("had not started, so it goes back in line" in m for m in said), said
    assert "ForkServerUnsure" in controller.log(), "the start was not left unanswered"
    assert not status.get("runs"), f"a run was recorded (no run was started: the stop came first): {status}"
    stdout = env.run_dir("unsure", 1) / "stdout"
    assert not stdout.exists() or not stdout.read_text(), "the command ran"
    # removed by the step that found the run never started, before it wrote the job's status
    assert not run_cgroup_dirs(hier, uid), "the cgroup kept for the unanswered start outlived the job's stop"
