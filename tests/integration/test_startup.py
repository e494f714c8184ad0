"""What a controller finds at start-up: work asked for while no controller was running."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply import apply_manifests
from reconciler.commands import rerun
from reconciler.controller.manager import Controller
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
