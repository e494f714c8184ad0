"""Runs spawned aside (controller/spawns.py), through a real controller on a real store: an
error of the spawn that persists is retried with the loop's growing backoff, a spawn slower
than START_REPORT still has a short run's start written with its end, a burst of runs starts
each once with one worker or several, and a job changed while its spawn is pending stops its
run. LocalAgent.start is wrapped (held at a gate, or made to fail); the runs are real."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from reconciler.agent.forkserver import ForkServerUnsure
from reconciler.agent.local import LocalAgent
from reconciler.apply import apply_manifests
from reconciler.controller.manager import Controller
from reconciler.manifests import parse_text
from reconciler.store import Store
from tests.helpers import wait_until

JOB = """apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: unsure}
spec: {command: [/bin/true]}
"""


def _applied(url: str, folder: Path, text: str) -> Store:
    """A store at `url` with the manifests of `text` applied."""
    store = Store(url)
    manifests, problems = parse_text(text, "jobs.yaml", folder)
    assert not problems
    apply_manifests(store, manifests)
    return store


def test_a_spawn_error_that_persists_is_retried_with_the_loops_growing_backoff(
    sqlite_url, tmp_path, monkeypatch, caplog
):
    """A spawn that keeps raising something other than StartFailed (ForkServerUnsure here;
    Fenced while the lease lapsed is the other) is an error of the job's step each time,
    counted by the runner, which backs off further each time and warns past the third: the
    count grows, it is not reset by a step that asks for the spawn again."""
    calls: list[int] = []

    def unsure(self, job, uid, number, spec, revision):
        calls.append(number)
        raise ForkServerUnsure("no answer from the fork server")

    monkeypatch.setattr(LocalAgent, "start", unsure)
    store = _applied(sqlite_url, tmp_path, JOB)
    caplog.set_level(logging.WARNING, logger="reconciler")
    controller = Controller(store).start()
    try:

        def warned() -> bool:
            return any("reconcile unsure failed (ForkServerUnsure" in r.getMessage() for r in caplog.records)

        wait_until(warned, timeout=30, message="the runner's warning after its fourth failure in a row")
        assert len(calls) >= 4
    finally:
        controller.stop(drain=False)
        store.dispose()


QUICK = """apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: quick}
spec: {command: [/bin/true]}
"""


def test_a_short_run_whose_spawn_was_slow_still_has_its_start_written_with_its_end(sqlite_url, tmp_path, monkeypatch):
    """docs/architecture.md: the job stays Starting until the run has lived START_REPORT or
    its exit wakes it, so a short run's start and end are one status write. A spawn that
    takes longer than START_REPORT (a backlog of spawns, a slow fork server) must not make
    the woken step write the just-spawned run Running alone."""
    from reconciler.store import eventlog
    from reconciler.store import repository as repo

    original = LocalAgent.start
    holder: dict[str, Controller] = {}

    def slow(self, *args, **kwargs):
        spawns = holder["c"].jobs.runs.spawns
        # the spawn outlasts START_REPORT: the job's timer finds it pending
        wait_until(lambda: any(p.wanted for p in list(spawns._pending.values())), timeout=10)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LocalAgent, "start", slow)
    store = _applied(sqlite_url, tmp_path, QUICK)
    controller = holder["c"] = Controller(store)  # known to the wrapper before any spawn
    controller.start()
    try:

        def completed() -> bool:
            with store.read() as session:
                obj = repo.get(session, kind="Job", name="quick")
            return (obj.status or {}).get("phase") == "Completed"

        wait_until(completed, timeout=20, message="quick completed")
        with store.read() as session:
            events = {e.reason: e.resource_version for e in eventlog.newest(session, kind="Job", name="quick")}
        assert events["Started"] == events["Succeeded"], events
    finally:
        controller.stop(drain=False)
        store.dispose()


@pytest.mark.parametrize("workers", [1, 4])
def test_a_burst_of_short_runs_each_starts_once(sqlite_url, tmp_path, workers):
    from reconciler.store import repository as repo

    docs = ["apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: p}\nspec: {slots: 8}\n"]
    names = [f"j{i}" for i in range(120)]
    docs.extend(
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: {name}}}\n"
        "spec: {command: [/bin/true], pool: p}\n"
        for name in names
    )
    store = _applied(sqlite_url, tmp_path, "---\n".join(docs))
    controller = Controller(store, workers=workers).start()
    try:

        def done():
            with store.read() as session:
                objs = repo.list_objects(session, kind="Job")
            return all((o.status or {}).get("phase") == "Completed" for o in objs) and objs

        objs = wait_until(done, timeout=90, message="all completed")
        for obj in objs:
            runs = obj.status.get("runs", [])
            assert len(runs) == 1 and obj.status.get("outcome") == "Succeeded", (obj.name, obj.status)
    finally:
        controller.stop(drain=False)
        store.dispose()


SLEEPER = """apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: sleeper}
spec: {command: [sleep, "60"]}
"""


@pytest.mark.parametrize("what", ["cancel", "delete", "suspend", "drain"])
def test_a_job_changed_while_its_spawn_is_pending_stops_its_run(sqlite_url, tmp_path, monkeypatch, what):
    import psutil

    from reconciler import commands
    from reconciler.apply import delete
    from reconciler.store import repository as repo

    original = LocalAgent.start
    gate = threading.Event()
    started: list = []

    def gated(self, *args, **kwargs):
        assert gate.wait(20)
        s = original(self, *args, **kwargs)
        started.append(s)
        return s

    monkeypatch.setattr(LocalAgent, "start", gated)
    store = _applied(sqlite_url, tmp_path, SLEEPER)
    controller = Controller(store).start()
    try:

        def pending():
            return any(p.wanted for p in list(controller.jobs.runs.spawns._pending.values()))

        wait_until(pending, timeout=20, message="spawn pending, asked for")
        if what == "cancel":
            commands.cancel(store, "sleeper")
        elif what == "delete":
            delete(store, [("Job", "sleeper")])
        elif what == "suspend":
            commands.set_suspend(store, "sleeper", True)
        else:
            commands.drain(store, controller.node, force=True)
        gate.set()
        wait_until(lambda: started, timeout=20, message="spawned")

        def settled():
            with store.read() as session:
                obj = repo.get(session, kind="Job", name="sleeper")
            if obj is None:
                return "gone"
            phase = (obj.status or {}).get("phase")
            return phase if phase in ("Completed", "Suspended", "Queued", "Backoff") else None

        wait_until(settled, timeout=30, message="settled")
        ident = started[0].identity
        wait_until(
            lambda: not psutil.pid_exists(ident.pid) or psutil.Process(ident.pid).status() == "zombie",
            timeout=20,
            message="run stopped",
        )
    finally:
        gate.set()
        controller.stop(drain=False)
        store.dispose()
