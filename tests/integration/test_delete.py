"""`delete` of a running job (API.md 3: an active job is cancelled first), with a real
controller: the run is stopped and the job removed after; a pool deleted in the same call
goes with the jobs that are being deleted, though one of them is still stopping."""

from __future__ import annotations

from tests.helpers import wait_until

from .conftest import docs

POOL = "apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: px, labels: {grp: x}}\nspec: {slots: 1}\n"
RUNNING = (
    "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: jx, labels: {grp: x}}\n"
    "spec: {pool: px, command: [sleep, '60']}\n"
)
OTHER = (
    "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: jy, labels: {grp: y}}\n"
    "spec: {command: [sleep, '60']}\n"
)


def test_delete_by_label_takes_a_running_job_and_the_pool_it_runs_in(env):
    env.apply("all.yaml", docs(POOL, RUNNING, OTHER))
    env.controller().wait_ready()
    wait_until(lambda: env.status("jx").get("phase") == "Running", timeout=30, message="jx running")
    result = env.cli("delete", "-l", "grp=x")
    assert result.code == 0, result
    assert sorted(result.stdout.splitlines()) == ["job.reconciler.dev/jx deleting", "pool.reconciler.dev/px deleted"]
    wait_until(lambda: env.peek("jx") is None, timeout=60, message="jx stopped and removed")
    assert env.peek("jy") is not None and env.status("jy").get("phase") == "Running"  # not selected
