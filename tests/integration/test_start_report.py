"""When a run's start is written: a run that ends within `runs.START_REPORT` has its start
written with its end (one transaction: both events, the run's startedAt and pid kept); a run
that lives on is shown Running with its pid while it lives."""

from __future__ import annotations

from reconciler.store import eventlog

from .conftest import held_until, job_yaml


def _events(env, name: str) -> dict[str, int]:
    """reason -> the resourceVersion (the transaction) of its last event, for one job."""
    with env.store.read() as session:
        return {e.reason: e.resource_version for e in eventlog.newest(session, kind="Job", name=name)}


def test_a_short_runs_start_is_written_with_its_end(env):
    manifest = env.write("quick.yaml", job_yaml("quick", "command: [/bin/true]"))
    result = env.up(manifest, timeout="30s")
    assert result.code == 0, result.stderr

    events = _events(env, "quick")
    assert events["Started"] == events["Succeeded"]  # one transaction, not a Running write before
    assert events["Admitted"] < events["Started"]  # the admission was committed before the spawn
    status = env.status("quick")
    run = status["runs"][0]
    assert run["pid"] > 0 and run["startedAt"] <= run["finishedAt"]
    assert status["startTime"] == run["startedAt"]


def test_a_run_that_lives_on_is_shown_running_with_its_pid(env):
    go = env.root / "go"
    env.controller()
    env.apply("held.yaml", job_yaml("held", held_until(go)))
    running = env.wait_phase("held", "Running", timeout=30)
    run = running["runs"][0]
    assert run["pid"] > 0 and run["finishedAt"] is None
    started = _events(env, "held")["Started"]

    go.touch()
    env.wait_completed("held")
    events = _events(env, "held")
    assert events["Started"] == started < events["Succeeded"]  # its start was written alone, first
    assert env.status("held")["runs"][0]["pid"] == run["pid"]
