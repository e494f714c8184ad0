"""A Source's lane stores a suspended job as the loop's first look would leave it; the loop
then need not look at it at all (controller/settled.py): the lane hints the change watcher
as its batch commits, before the watcher is told of the commit. A started controller, in
this process, over the test's HTTP queue server: the suspended jobs are not looked at, the
others are and run, and a suspended one resumed later runs."""

from __future__ import annotations

import json

from reconciler.commands import set_suspend
from reconciler.controller.manager import Controller
from reconciler.reads import job_statuses
from reconciler.store import Store
from reconciler.store import repository as repo
from tests.data.httpqueue import QueueServer
from tests.helpers import wait_until


def test_jobs_stored_suspended_are_not_looked_at_until_resumed(sqlite_url, monkeypatch):
    # the watcher polls only when told of a commit (an hour's period otherwise): what it
    # skips is then exactly what the hints name, not what a timed poll happened to miss
    monkeypatch.setenv("RECONCILER_POLL_INTERVAL", "3600")
    store = Store(sqlite_url)
    with QueueServer() as server:
        for i in range(1, 21):
            server.put("jobs", f"s{i}", json.dumps({"command": "true"}))
        # a manifest wins over the template: this one is not suspended
        manifest = {"kind": "Job", "metadata": {"name": "runs"}, "spec": {"shell": "true", "suspend": False}}
        server.put("jobs", "run", json.dumps({"apiVersion": "reconciler.dev/v1alpha1", **manifest}))
        with store.write() as tx:
            spec = {"http": {"url": server.url, "queue": "jobs"}, "template": {"suspend": True}}
            repo.create(tx, kind="Source", name="inbox", spec=spec, labels={}, annotations={})
        controller = Controller(store)
        looked: list[str] = []
        reconcile = controller.runner._reconcile
        controller.runner._reconcile = lambda key: (looked.append(key), reconcile(key))[1]
        controller.start()
        try:
            wait_until(lambda: not server.waiting("jobs"), 30, message="every message stored and deleted")
            wait_until(lambda: len(controller.settled) == 0, 10, message="the watcher took the hints")
            with store.read() as session:
                jobs = {o.name: o.status["phase"] for o in repo.list_objects(session, kind="Job")}
            suspended = sorted(name for name, phase in jobs.items() if phase == "Suspended")
            assert len(suspended) == 20 and "runs" not in suspended
            assert set(looked).isdisjoint(suspended), sorted(set(looked) & set(suspended))
            wait_until(lambda: job_statuses(store, ["runs"])["runs"].get("outcome") == "Succeeded", 30)
            assert "runs" in looked

            # resumed (a write of this process, which the watcher is told of): looked at, run
            set_suspend(store, suspended[0], False)
            wait_until(
                lambda: job_statuses(store, [suspended[0]])[suspended[0]].get("outcome") == "Succeeded",
                30,
                message="the resumed job ran",
            )
            assert suspended[0] in looked
        finally:
            controller.stop(drain=False)
            store.dispose()
