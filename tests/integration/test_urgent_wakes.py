"""Work that starts or ends a run goes before a backlog (runtime.WorkQueue's urgent lane).

After `apply` of thousands of jobs the controller has one queued key per job. A run that
ends meanwhile, or the job first in line for the slot it freed, must not wait behind all of
them: the slot would sit idle, and the run's record would end when the backlog was done
(measured before the lane: 3,000 jobs on 2 slots, the first two /bin/true runs recorded as
5.3 s long). A wired controller, never started, is driven by hand here."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply import apply_manifests
from reconciler.controller.manager import Controller
from reconciler.controller.nodes import heartbeat
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import Store
from tests.helpers import wait_until

MANIFESTS = """apiVersion: reconciler.dev/v1alpha1
kind: Pool
metadata: {name: one}
spec: {slots: 1}
---
apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: first}
spec: {command: [/bin/true], pool: one}
---
apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: second}
spec: {command: [/bin/true], pool: one}
"""
BACKLOG = [f"backlog-{i}" for i in range(50)]  # keys of jobs that do not exist: cheap to reconcile


def drive(wired: Controller, name: str, phase: str) -> None:
    for _ in range(10):
        if job_statuses(wired.store, [name])[name].get("phase") == phase:
            return
        wired.jobs(name)
    raise AssertionError(f"{name} did not reach {phase}: {job_statuses(wired.store, [name])[name]}")


def test_an_ended_run_and_the_job_next_in_line_go_before_a_backlog(sqlite_url, tmp_path):
    store = Store(sqlite_url)
    manifests, problems = parse_text(MANIFESTS, "urgent.yaml", Path(tmp_path))
    assert not problems
    apply_manifests(store, manifests)
    wired = Controller(store)
    heartbeat(store, wired.node, wired.owner, wired.clock.now())  # what start() does first
    try:
        drive(wired, "first", "Running")  # spawned here; the exit watcher reports its end
        drive(wired, "second", "Queued")  # the pool's one slot is taken
        for key in BACKLOG:
            wired.queue.add(key)
        wait_until(lambda: len(wired.queue) == len(BACKLOG) + 1, message="the exit of `first` was not reported")

        assert wired.queue.get() == "first"  # its exit, ahead of the backlog
        wired.jobs("first")  # records the exit and releases the slot
        wired.queue.done("first")
        assert job_statuses(store, ["first"])["first"]["outcome"] == "Succeeded"

        assert wired.queue.get() == "second"  # first in line for the freed slot
        wired.queue.done("second")
        assert wired.queue.get() == BACKLOG[0]  # the backlog follows, in its order
    finally:
        wired.agent.close()
        store.dispose()


def test_the_node_heartbeat_does_not_wait_for_the_work_queue(sqlite_url, tmp_path, monkeypatch):
    """The change watcher posts it: a backlog of keys (here, a queue nobody serves at all)
    cannot hold it past the node's readiness window."""
    from reconciler.controller import manager
    from reconciler.store import repository as repo

    monkeypatch.setattr(manager, "HEARTBEAT_INTERVAL", 0.05)
    store = Store(sqlite_url)
    wired = Controller(store)
    for key in BACKLOG:
        wired.queue.add(key)

    def beat() -> str | None:
        with store.read() as session:
            node = repo.get(session, kind="Node", name=wired.node)
        return node and node.status.get("heartbeatAt")

    wired._watcher.start()  # the change watcher alone: no reconcile worker runs
    try:
        first = wait_until(beat, message="no heartbeat was posted")
        wait_until(lambda: beat() != first, message="the heartbeat did not advance")
    finally:
        wired._stop.set()
        wired._watcher.join(5)
        wired.agent.close()
        store.dispose()
