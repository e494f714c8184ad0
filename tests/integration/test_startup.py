"""What a controller finds at start-up: work asked for while no controller was running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reconciler.apply import apply_manifests
from reconciler.commands import rerun
from reconciler.controller.manager import GC_YOUNG, Controller
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import Store
from tests.helpers import wait_until

JOB = """apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: once}
spec: {command: ["true"]}
"""


def _converge(store: Store, predicate) -> dict:
    controller = Controller(store).start()
    try:
        return wait_until(lambda: predicate(job_statuses(store, ["once"]).get("once", {})), timeout=30)
    finally:
        controller.stop()


def test_a_rerun_asked_while_no_controller_runs_is_done_by_the_next_one(sqlite_url, tmp_path):
    store = Store(sqlite_url)
    manifests, problems = parse_text(JOB, "once.yaml", Path(tmp_path))
    assert not problems
    apply_manifests(store, manifests)
    _converge(store, lambda s: s.get("outcome") == "Succeeded")

    rerun(store, "once", downstream=False)  # no controller is running now
    status = _converge(store, lambda s: s.get("revision") == 2 and s.get("phase") == "Completed" and s)
    assert [(r["number"], r["revision"], r["outcome"]) for r in status["runs"]] == [
        (1, 1, "Succeeded"),
        (2, 2, "Succeeded"),
    ]


def test_a_spec_change_made_while_no_controller_runs_is_run_by_the_next_one(sqlite_url, tmp_path):
    store = Store(sqlite_url)
    manifests, _ = parse_text(JOB, "once.yaml", Path(tmp_path))
    apply_manifests(store, manifests)
    _converge(store, lambda s: s.get("outcome") == "Succeeded")

    changed, _ = parse_text(JOB.replace('["true"]', '["sh", "-c", "exit 0"]'), "once.yaml", Path(tmp_path))
    apply_manifests(store, changed)
    status = _converge(store, lambda s: s.get("revision") == 2 and s.get("phase") == "Completed" and s)
    assert status["outcome"] == "Succeeded" and len(status["runs"]) == 2


def test_a_controller_collects_young_objects_less_often_and_freezes_what_the_process_held(sqlite_url, tmp_path):
    # a fresh interpreter: the pytest process's collector has been tuned by other tests' controllers
    script = """
import gc, sys
from reconciler.controller.manager import GC_YOUNG, Controller
from reconciler.store import Store
assert gc.get_threshold()[0] < GC_YOUNG and gc.get_freeze_count() == 0
controller = Controller(Store(sys.argv[1]), local_node=False, sources=False).start()
frozen = gc.get_freeze_count()
controller.stop()
controller = Controller(Store(sys.argv[1]), local_node=False, sources=False).start()  # a second term
print(gc.get_threshold()[0], frozen, gc.get_freeze_count())
controller.stop()
"""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script, sqlite_url], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    threshold, frozen, later = (int(n) for n in done.stdout.split())
    assert threshold == GC_YOUNG
    assert frozen > 10_000  # modules, classes, schemas: out of every later collection's walk
    # frozen once a process (a frozen object leaves when freed, none joins): a second term
    # leaves the first's garbage to the collector
    assert later <= frozen
