"""A wired controller, never started, driven by hand: each test calls its reconciler for the
keys it names, in the order it needs, with no worker thread to race it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reconciler.agent.cgroups import CgroupUnavailable, detect
from reconciler.apply import apply_manifests
from reconciler.controller.manager import Controller
from reconciler.controller.nodes import heartbeat
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import Store
from reconciler.store import repository as repo
from tests.helpers import wait_until
from tests.resources.conftest import run_cgroup_dirs


def pool_of_one(*jobs: str) -> str:
    """Pool `one` of one slot and a /bin/true job in it per `name` or `name:priority`."""
    docs = ["apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: one}\nspec: {slots: 1}\n"]
    for entry in jobs:
        name, _, priority = entry.partition(":")
        extra = f", priority: {priority}" if priority else ""
        docs.append(
            f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: {name}}}\n"
            f"spec: {{command: [/bin/true], pool: one{extra}}}\n"
        )
    return "---\n".join(docs)


@contextmanager
def wired_controller(url: str, folder: Path, manifests: str) -> Iterator[Controller]:
    """The manifests applied to a store at `url`, and a Controller on it whose node is Ready."""
    store = Store(url)
    parsed, problems = parse_text(manifests, "wired.yaml", folder)
    assert not problems
    apply_manifests(store, parsed)
    wired = Controller(store)
    heartbeat(store, wired.node, wired.owner, wired.clock.now())  # what start() does first
    try:
        yield wired
    finally:
        # as Controller.stop: the spawns first, so that no run asked for in a step starts a
        # fork server after the agent has closed its own
        wired.jobs.runs.spawns.close()
        wired.agent.close()
        _remove_run_cgroups(store)
        store.dispose()


def _remove_run_cgroups(store: Store) -> None:
    """The cgroups of the runs a test started and no step of it ended: they are the
    machine's, not in the test's folder, and nothing else would remove them."""
    try:
        hierarchy = detect()
    except CgroupUnavailable:
        return
    with store.read() as session:
        uids = [job.uid for job in repo.list_objects(session, kind="Job")]
    for uid in uids:
        for name in {d.name for d in run_cgroup_dirs(hierarchy, uid)}:
            group = hierarchy.open(name)
            group.kill_all()  # the test is over: what it started goes
            wait_until(group.remove, timeout=10, message=f"the run cgroup {name} emptied and removed")


def drive(wired: Controller, name: str, phase: str) -> None:
    for _ in range(10):
        if job_statuses(wired.store, [name])[name].get("phase") == phase:
            return
        wired.jobs(name)
    raise AssertionError(f"{name} did not reach {phase}: {job_statuses(wired.store, [name])[name]}")
