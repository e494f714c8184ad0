"""A run spawned by one live controller is never adopted by another (API.md: admission and
crash safety). The second controller sees the job Starting with a live wrapper in its run
dir, but the admission's spawn belongs to a controller that is alive: it leaves the run
alone, so exactly one controller records it (the one that knows when it really started)."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import psutil

from reconciler.agent.groups import signal_group
from reconciler.agent.identity import is_alive
from reconciler.apply import apply_manifests
from reconciler.controller.manager import Controller
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import Store
from reconciler.store import repository as repo
from reconciler.store import scheduling as sched
from tests.helpers import wait_until

JOB = """apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: owned}
spec: {command: [sleep, "30"]}
"""


def test_a_live_controllers_spawn_is_not_adopted_by_another(sqlite_url, tmp_path):
    store = Store(sqlite_url)
    manifests, problems = parse_text(JOB, "owned.yaml", Path(tmp_path))
    assert not problems
    apply_manifests(store, manifests)
    other = subprocess.Popen(["sleep", "60"])  # stands in for the other, live, controller
    wired = Controller(store)  # this controller: wired, never started, driven by hand
    identity = started = None
    try:
        me = psutil.Process(other.pid)
        owner = f"{socket.gethostname()}:{other.pid}:{me.create_time()}"
        with store.read() as session:
            obj = repo.get(session, kind="Job", name="owned")
        # the other controller admitted the job, claimed the spawn and started the wrapper,
        # and has not recorded the run yet
        with store.write() as tx:
            sched.admit(tx, uid=obj.uid, name="owned", pool=None, slots=1, node=wired.node, run_number=1, owner=owner)
            repo.update_object(
                tx,
                obj,
                status={
                    **obj.status,
                    "phase": "Starting",
                    "acceptedAt": obj.status.get("acceptedAt") or "2026-01-01T00:00:00.000Z",
                    "admission": {"pool": None, "slots": 1},
                },
            )
        spec = wired.jobs.spec_of(obj)
        started = wired.agent.start("owned", obj.uid, 1, spec, 1)  # the other controller's spawn
        identity = started.identity

        wired.jobs("owned")

        status = job_statuses(store, ["owned"])["owned"]
        assert status["phase"] == "Starting", status  # not recorded by this controller
        assert not status.get("runs"), status
        with store.read() as session:
            held = sched.admission(session, obj.uid)
        assert held.owner == owner  # the spawn still belongs to the other controller
        assert is_alive(identity)  # and the run was left alone
    finally:
        if identity is not None and started is not None:
            signal_group(identity, signal.SIGKILL)
            wait_until(lambda: not wired.agent.alive(identity, started.cgroup), timeout=10)
            wired.agent.remove_cgroup(started.cgroup)  # the run's, which no controller recorded
        wired.agent.close()
        other.kill()
        other.wait()
        store.dispose()
