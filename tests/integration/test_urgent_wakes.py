"""Work that starts or ends a run goes before a backlog (runtime.WorkQueue's urgent lane).

After `apply` of thousands of jobs the controller has one queued key per job. A run that
ends meanwhile, or the job first in line for the slot it freed, must not wait behind all of
them: the slot would sit idle, and the run's record would end when the backlog was done
(measured before the lane: 3,000 jobs on 2 slots, the first two /bin/true runs recorded as
5.3 s long). A wired controller, never started, is driven by hand here."""

from __future__ import annotations

from reconciler.controller.manager import Controller
from reconciler.reads import job_statuses
from reconciler.store import Store
from tests.helpers import wait_until
from tests.integration.wired import drive, pool_of_one, wired_controller

BACKLOG = [f"backlog-{i}" for i in range(50)]  # keys of jobs that do not exist: cheap to reconcile


def test_an_ended_run_and_the_job_next_in_line_go_before_a_backlog(sqlite_url, tmp_path):
    with wired_controller(sqlite_url, tmp_path, pool_of_one("first", "second")) as wired:
        # admitted and spawned here (a short run's start is written with its end); the exit
        # watcher reports its end
        drive(wired, "first", "Starting")
        drive(wired, "second", "Queued")  # the pool's one slot is taken
        for key in BACKLOG:
            wired.queue.add(key)
        wait_until(lambda: len(wired.queue) == len(BACKLOG) + 1, message="the exit of `first` was not reported")

        assert wired.queue.get() == "first"  # its exit, ahead of the backlog
        wired.jobs("first")  # records the exit and releases the slot
        wired.queue.done("first")
        assert job_statuses(wired.store, ["first"])["first"]["outcome"] == "Succeeded"

        assert wired.queue.get() == "second"  # first in line for the freed slot
        wired.queue.done("second")
        assert wired.queue.get() == BACKLOG[0]  # the backlog follows, in its order


def test_the_node_heartbeat_does_not_wait_for_the_work_queue(sqlite_url, tmp_path, monkeypatch):
    """The change watcher posts it: a backlog of keys (here, a queue nobody serves at all)
    cannot hold it past the node's readiness window."""
    from reconciler.controller import nodes
    from reconciler.store import repository as repo

    monkeypatch.setattr(nodes, "HEARTBEAT_INTERVAL", 0.05)
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


def test_the_next_in_line_is_woken_when_the_head_it_waited_for_is_admitted_with_room_left(sqlite_url, tmp_path):
    """A job that looked first and found an older one at the head of its line, fitting, waits
    for its turn; when that head is admitted and room is left, the waiting one is woken at
    once (before: nothing woke it until the next release of slots or its safety poll)."""
    go = tmp_path / "go"
    manifests = "---\n".join(
        [
            "apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: two}\nspec: {slots: 2}\n",
            "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: big}\n"
            f"spec: {{shell: \"while [ ! -e '{go}' ]; do sleep 0.05; done\", pool: two, slots: 2}}\n",
            "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: ahead}\n"
            "spec: {command: [/bin/true], pool: two, priority: 5}\n",
            "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: behind}\n"
            "spec: {command: [/bin/true], pool: two}\n",
        ]
    )

    def drain() -> list[str]:
        keys = []
        while len(wired.queue):
            keys.append(wired.queue.get())
            wired.queue.done(keys[-1])
        return keys

    with wired_controller(sqlite_url, tmp_path, manifests) as wired:
        drive(wired, "big", "Starting")  # both slots
        drive(wired, "ahead", "Queued")
        drive(wired, "behind", "Queued")
        drain()
        go.touch()
        wait_until(lambda: "big" in drain(), message="the end of `big` was not reported")
        wired.jobs("big")  # its end frees both slots and wakes the first in line
        drain()
        wired.jobs("behind")  # looks first: `ahead` heads the line and fits, so it waits its turn
        assert job_statuses(wired.store, ["behind"])["behind"]["phase"] == "Queued"
        assert drain() == ["ahead"]  # the head is woken
        wired.jobs("ahead")  # admitted, one slot left
        assert job_statuses(wired.store, ["ahead"])["ahead"]["phase"] in ("Starting", "Running")
        assert "behind" in drain()  # woken at once: it fits in the slot left
        wired.jobs("behind")
        assert job_statuses(wired.store, ["behind"])["behind"]["phase"] in ("Starting", "Running", "Completed")
