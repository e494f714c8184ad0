"""The Starting step of a run placed on a remote agent's node reads the agent's report on
the admission once per step, and not at all while the admission is in the step's own
uncommitted batch (no agent can have seen it); an admission this process made and
committed may have been reported on already, and the step reads that report. The
controller's steps are taken by hand here, on a real store, without its threads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from reconciler import noderuns
from reconciler.apply import apply_manifests
from reconciler.controller import runs as runs_module
from reconciler.controller.manager import Controller
from reconciler.manifests import parse_text
from reconciler.store import Store
from reconciler.store import repository as repo
from reconciler.store import scheduling as sched

JOB = "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata:\n  name: j\nspec:\n  command: [/bin/true]\n"
AGENT = "farhost:1:1.0"


@pytest.fixture
def controller(store_url, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    store = Store(store_url)
    noderuns.heartbeat(store, "far", noderuns.Beat(agent=AGENT, address="10.0.0.2", capacity={"slots": 1}), time.time())
    manifests, problems = parse_text(JOB, "job.yaml", Path(tmp_path))
    assert not problems
    apply_manifests(store, manifests)
    made = Controller(store, local_node=False, sources=False)
    yield made
    made.agent.close()
    store.dispose()


def _phase(store: Store) -> str:
    with store.read() as conn:
        obj = repo.get(conn, kind="Job", name="j")
        assert obj is not None
        return str(obj.status.get("phase"))


@pytest.fixture
def admission_reads(monkeypatch) -> list[str]:
    """The uids whose admission the controller's steps read (the real read is made)."""
    read: list[str] = []
    real = sched.admission

    def counted(session, uid):
        read.append(uid)
        return real(session, uid)

    monkeypatch.setattr(runs_module.sched, "admission", counted)
    return read


def _admission(store: Store, uid: str) -> sched.Admission:
    with store.read() as conn:
        held = sched.admission(conn, uid)
    assert held is not None
    return held


def test_a_report_made_after_the_admission_committed_is_read_by_the_next_starting_step(controller, admission_reads):
    store = controller.store
    with store.batch():
        controller.jobs("j")  # eligible, queued, admitted and placed on the one remote node
    assert _phase(store) == "Starting"
    with store.read() as conn:
        job = repo.get(conn, kind="Job", name="j")
    assert job is not None
    held = _admission(store, job.uid)
    assert held.node == "far"
    # as when a step's loop ends right after the admission: what this process admitted, and
    # committed, is remembered for the Starting step, which has not looked at it yet
    controller.jobs.endings.admitted[job.uid] = sched.Admission(held.node, held.run_number, held.owner)
    # the agent learns of it, runs it, and reports its start and end before the job's next step
    stamp = "2026-12-07T00:00:00.000Z"
    facts = {"pid": 4242, "processStartTime": 1.0, "startedAt": stamp, "finishedAt": stamp, "exitCode": 0}
    report = noderuns.Report(job.uid, held.run_number, held.epoch or 0, facts, "j")
    kept, _ = noderuns.report_many(store, "far", [report], AGENT)
    assert kept == [True]
    admission_reads.clear()
    with store.batch():
        controller.jobs("j")
    assert admission_reads == [job.uid], "the step read the admission more than once, or not at all"
    with store.read() as conn:
        done = repo.get(conn, kind="Job", name="j")
    assert done is not None
    assert (done.status.get("phase"), done.status.get("outcome")) == ("Completed", "Succeeded"), done.status


def test_a_starting_step_in_the_batch_that_made_the_admission_reads_no_report(controller, admission_reads):
    store = controller.store
    with store.batch():
        # the job's steps up to Starting, and its first Starting step, in the batch that
        # made the admission: no agent can have seen it, there is nothing to read
        controller.jobs("j")
        assert store.uncommitted(_uid(store))
    assert admission_reads == []
    assert _phase(store) == "Starting"


def _uid(store: Store) -> str:
    with store.read() as conn:
        job = repo.get(conn, kind="Job", name="j")
    assert job is not None
    return job.uid
