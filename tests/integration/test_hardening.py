"""Hardening (issue 16): a run that cannot start ends and frees its slot, an orphaned process
group is polled instead of spun on, and a run sees its own identity but none of
reconciler's own variables."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import psutil

from reconciler.agent.local import ProcessIdentity
from reconciler.apply import apply_manifests
from reconciler.controller.manager import Controller
from reconciler.controller.nodes import heartbeat
from reconciler.controller.runs import ORPHAN_POLL
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import Store
from tests.helpers import wait_until

from .conftest import job_yaml


def test_a_run_that_cannot_start_ends_start_failed_and_frees_its_slot(env):
    """Any error while starting a run (here its run dir is taken by a file; a full disk
    does the same) ends the run StartFailed; before, the job held its slot in Starting
    forever while the error was retried."""
    env.apply(
        "jobs.yaml",
        "apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: one}\nspec: {slots: 1}\n---\n"
        + job_yaml("blocked", "command: ['true']\npool: one")
        + "---\n"
        + job_yaml("next", "command: ['true']\npool: one\ndependsOn: [{job: blocked, outcomes: [Finished]}]"),
    )
    in_the_way = env.run_dir("blocked", 1)
    in_the_way.parent.mkdir(parents=True, exist_ok=True)
    in_the_way.write_text("not a directory\n")
    env.controller()
    env.wait_completed("blocked", "next")
    blocked, after = env.status("blocked"), env.status("next")
    assert (blocked["outcome"], blocked["reason"]) == ("Failed", "StartFailed"), blocked
    assert blocked["runs"][0]["outcome"] == "StartFailed" and "cannot start run" in blocked["message"]
    assert after["outcome"] == "Succeeded", after  # the pool's one slot came free


def test_a_run_sees_its_identity_and_none_of_reconcilers_variables(env):
    out = env.root / "env.txt"
    env.apply("job.yaml", job_yaml("who", f"shell: env > {out}\nenv: {{RECONCILER_OWN: set-by-the-spec}}"))
    env.controller()
    env.wait_completed("who")
    seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    doc = env.get_job("who")
    assert seen["RECONCILER_JOB"] == "who" and seen["RECONCILER_RUN"] == "1"
    assert seen["RECONCILER_JOB_UID"] == doc["metadata"]["uid"]
    assert seen["RECONCILER_OWN"] == "set-by-the-spec"  # what the spec asks for, it gets
    assert "RECONCILER_STORE" not in seen  # the controller had it (see ControllerProcess)


JOB = """apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: orphan}
spec: {shell: "sleep 30; true"}
"""


def settle(wired: Controller) -> None:
    """Until the exit watcher has answered every watch asked of it so far: it answers them
    in order, so once a watch asked now is answered, so are all the earlier ones."""
    answered = threading.Event()
    wired.agent._watcher.watch(ProcessIdentity(os.getpid(), 0.0), lambda _: answered.set())  # no such process
    assert answered.wait(10)


def test_an_orphaned_group_is_polled_on_a_timer_not_watched(sqlite_url, tmp_path):
    """kill -9 of a run's wrapper while its command lives: nothing will say when the rest
    ends. Watching the dead wrapper fired at once, every time, and the job went round the
    queue as fast as the controller could go (~72% of a core). Driven by hand here: the
    step must ask for a timer and leave no wake-up behind."""
    store = Store(sqlite_url)
    manifests, problems = parse_text(JOB, "orphan.yaml", Path(tmp_path))
    assert not problems
    apply_manifests(store, manifests)
    wired = Controller(store)  # wired, never started: no worker takes keys off its queue
    heartbeat(store, wired.node, wired.owner, wired.clock.now())
    wrapper = None
    try:

        def running() -> bool:  # stepped by hand until its run, spawned aside, is written Running
            if job_statuses(store, ["orphan"])["orphan"].get("phase") == "Running":
                return True
            wired.jobs("orphan")
            return False

        wait_until(running, message="the run written Running")
        run = job_statuses(store, ["orphan"])["orphan"]["runs"][0]
        wrapper = ProcessIdentity(run["pid"], run["processStartTime"])
        wait_until(lambda: len(psutil.Process(wrapper.pid).children()) == 1, message="the command started")
        os.kill(wrapper.pid, signal.SIGKILL)  # the wrapper only; `sleep` lives on in its group
        wait_until(lambda: not wired.agent.wrapper_alive(wrapper), message="the wrapper died")
        settle(wired)
        while (key := wired.queue.get_nowait()) is not None:  # the wrapper's exit woke the job: right
            wired.queue.done(key)

        result = wired.jobs("orphan")
        assert result.requeue_after is not None and 0 < result.requeue_after <= ORPHAN_POLL, result
        assert job_statuses(store, ["orphan"])["orphan"]["phase"] == "Running"  # its process lives
        settle(wired)
        assert wired.queue.get_nowait() is None, "the step left a wake-up: it would run again at once"
    finally:
        if wrapper is not None:
            os.killpg(wrapper.pid, signal.SIGKILL)
        wired.jobs.runs.spawns.close()
        wired.agent.close()
        store.dispose()
