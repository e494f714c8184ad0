"""Admission: pool capacity at every instant, priority then eligibleAt order, bounded
bypass of a head that does not fit, and lowering a pool below its use."""

from __future__ import annotations

from reconciler.store.dbapi import Statement
from tests.helpers import wait_until

from .conftest import STAMP, docs, epoch, held_until, job_yaml, max_concurrent, pool_yaml, run_intervals


def _hold_the_only_slot(env, go) -> None:
    """A controller, and pool `solo` of one slot held by `blocker` until `go` exists."""
    env.controller()
    env.apply("blocker.yaml", docs(pool_yaml("solo", 1), job_yaml("blocker", held_until(go) + "\npool: solo")))
    env.wait_phase("blocker", "Running")


def _start(jobs: dict, name: str) -> float:
    return epoch(jobs[name]["status"]["runs"][0]["startedAt"])


def test_pool_of_one_never_runs_two(any_env):
    env = any_env
    names = [f"one-{i}" for i in range(1, 5)]
    manifest = env.write(
        "one.yaml", docs(pool_yaml("single", 1), *(job_yaml(n, "command: [sleep, '0.2']\npool: single") for n in names))
    )
    result = env.up(manifest)
    assert result.code == 0, result.stderr
    jobs = env.jobs()
    intervals = run_intervals(jobs, names)
    assert len(intervals) == 4
    assert max_concurrent(intervals) == 1


def test_every_job_that_ends_leaves_the_line(any_env):
    """An admitted job's queue row goes with its admission; one cancelled while queued, or
    failed after retries, has its row removed when it completes: no ended job holds a place."""
    env = any_env
    go = env.root / "go"
    _hold_the_only_slot(env, go)
    env.apply(
        "line.yaml",
        docs(
            job_yaml("cancelled", "command: ['true']\npool: solo"),
            job_yaml("fails", "command: ['false']\npool: solo\nretry: {limit: 1, backoff: {delay: 50ms}}"),
            job_yaml("quick", "command: ['true']\npool: solo"),
        ),
    )
    for name in ("cancelled", "fails", "quick"):
        env.wait_phase(name, "Queued")
    env.ok("cancel", "job/cancelled")
    env.wait_completed("cancelled")
    go.touch()
    env.wait_completed()
    outcomes = {n: j["status"]["outcome"] for n, j in env.jobs().items()}
    assert outcomes == {"blocker": "Succeeded", "cancelled": "Cancelled", "fails": "Failed", "quick": "Succeeded"}
    with env.store.read() as conn:
        assert Statement("SELECT job_name FROM queue").execute(conn).all() == []


def _in_line(env) -> list[tuple[str, float]]:
    with env.store.read() as conn:
        return [tuple(r) for r in Statement("SELECT job_name, eligible_at FROM queue ORDER BY job_name").execute(conn)]


def test_a_suspended_job_leaves_the_line_and_resumed_takes_its_place_again(any_env):
    """Only a job stored Queued holds a queue row: suspending it deletes the row (the suspend
    of a job that never queued deletes nothing), and resuming it puts it back at its old
    eligibleAt."""
    env, go = any_env, any_env.root / "go"
    _hold_the_only_slot(env, go)
    queued = job_yaml("queued", "command: ['true']\npool: solo")
    never_queued = job_yaml("held", "command: ['true']\npool: solo\nsuspend: true")
    env.apply("suspend.yaml", docs(queued, never_queued))
    env.wait_phase("held", "Suspended")
    [(name, eligible)] = wait_until(lambda: _in_line(env), message="the queued job's row")
    assert name == "queued"
    env.ok("suspend", "job/queued")
    env.wait_phase("queued", "Suspended")
    assert _in_line(env) == []
    env.ok("resume", "job/queued")
    env.wait_phase("queued", "Queued")
    assert _in_line(env) == [("queued", eligible)]
    go.touch()
    env.ok("resume", "job/held")
    env.wait_completed()
    assert _in_line(env) == []


def test_priority_then_eligible_order(env):
    go = env.root / "go"
    _hold_the_only_slot(env, go)
    # while the only slot is held, four jobs queue up: e1, e2, e3 become eligible in that
    # order (delays), `hi` last but with the highest priority
    env.apply(
        "contenders.yaml",
        docs(
            job_yaml("e1", "command: ['true']\npool: solo"),
            job_yaml("e2", "command: ['true']\npool: solo\nwaitFor: {conditions: [{delay: 300ms}]}"),
            job_yaml("e3", "command: ['true']\npool: solo\nwaitFor: {conditions: [{delay: 600ms}]}"),
            job_yaml("hi", "command: ['true']\npool: solo\npriority: 10\nwaitFor: {conditions: [{delay: 900ms}]}"),
        ),
    )
    for name in ("e1", "e2", "e3", "hi"):
        env.wait_phase(name, "Queued")
    go.touch()
    env.wait_completed()
    jobs = env.jobs()
    eligible = sorted(["e1", "e2", "e3", "hi"], key=lambda n: epoch(jobs[n]["status"]["eligibleAt"]))
    assert eligible == ["e1", "e2", "e3", "hi"]
    assert sorted(["e1", "e2", "e3", "hi"], key=lambda n: _start(jobs, n)) == ["hi", "e1", "e2", "e3"]
    assert max_concurrent(run_intervals(jobs)) == 1


def test_priority_decides_among_jobs_applied_together_into_a_free_pool(any_env):
    """Jobs stored together become eligible together: the free slot goes to the highest
    priority, not to the job the controller happened to look at first (names sort the
    other way round)."""
    env = any_env
    names = {"a-low": 0, "b-mid": 5, "c-high": 100}
    manifest = env.write(
        "together.yaml",
        docs(
            pool_yaml("solo", 1),
            *(job_yaml(n, f"command: ['true']\npool: solo\npriority: {p}") for n, p in names.items()),
        ),
    )
    result = env.up(manifest)
    assert result.code == 0, result.stderr
    jobs = env.jobs()
    assert sorted(names, key=lambda n: _start(jobs, n)) == ["c-high", "b-mid", "a-low"]
    assert max_concurrent(run_intervals(jobs, list(names))) == 1


def test_priority_decides_among_jobs_applied_together_to_a_running_controller(env):
    """The same with the controller already running: the change feed hands the stored jobs
    to the worker together, not one at a time."""
    env.controller()
    env.apply("pool.yaml", pool_yaml("solo", 1))
    names = {"a-low": 0, "b-mid": 5, "c-high": 100}
    env.apply(
        "together.yaml", docs(*(job_yaml(n, f"command: ['true']\npool: solo\npriority: {p}") for n, p in names.items()))
    )
    env.wait_completed()
    jobs = env.jobs()
    assert sorted(names, key=lambda n: _start(jobs, n)) == ["c-high", "b-mid", "a-low"]


def test_bounded_bypass(env):
    go = env.root / "go"
    smalls = [f"small-{i}" for i in range(1, 6)]
    env.controller()
    env.apply(
        "holder.yaml", docs(pool_yaml("pair", 2, max_bypass=2), job_yaml("holder", held_until(go) + "\npool: pair"))
    )
    env.wait_phase("holder", "Running")
    # `big` needs both slots and is first in line; it cannot fit while `holder` runs
    env.apply("big.yaml", job_yaml("big", "command: ['true']\npool: pair\nslots: 2"))
    env.wait_status("big", lambda s: s.get("reason") == "InsufficientSlots", what="big queued without room")
    # a stream of younger one-slot jobs may pass it at most twice (maxBypass)
    env.apply("smalls.yaml", docs(*(job_yaml(n, "command: [sleep, '0.3']\npool: pair") for n in smalls)))
    wait_until(
        lambda: any(env.status(n).get("reason") == "BypassLimit" for n in smalls),
        timeout=30,
        message="a small job held back by the bypass limit",
    )
    go.touch()
    env.wait_completed()
    jobs = env.jobs()
    assert all(j["status"]["outcome"] == "Succeeded" for j in jobs.values())
    big_start = _start(jobs, "big")
    passed = [n for n in smalls if _start(jobs, n) < big_start]
    assert len(passed) == 2, passed
    assert jobs["big"]["status"]["bypassCount"] == 2
    assert max_concurrent(run_intervals(jobs)) <= 2


def test_a_job_waiting_for_its_own_pool_holds_no_other_line(env):
    """A job whose own pool is full is no obstacle in the global scope, which has room for
    it: younger jobs pass it there without counting, however many, and are never held by
    the bypass limit (it held the whole store behind one full pool)."""
    go = env.root / "go"
    env.controller()
    env.apply(
        "full.yaml",
        docs(
            pool_yaml("global", 3, max_bypass=1),
            pool_yaml("narrow", 1),
            job_yaml("holder", held_until(go) + "\npool: narrow"),
        ),
    )
    env.wait_phase("holder", "Running")
    env.apply("waiting.yaml", job_yaml("waiting", "command: ['true']\npool: narrow"))
    env.wait_status("waiting", lambda s: s.get("reason") == "InsufficientSlots", what="waiting held by its pool")
    others = [f"other-{i}" for i in range(5)]
    for name in others:  # one after another: each is a pass of `waiting` in global's line
        env.apply(f"{name}.yaml", job_yaml(name, "command: ['true']"))
        env.wait_completed(name)
    status = env.status("waiting")
    assert (status["phase"], status["reason"]) == ("Queued", "InsufficientSlots")
    assert status.get("bypassCount", 0) == 0
    go.touch()
    env.wait_completed()
    assert {n: j["status"]["outcome"] for n, j in env.jobs().items()} == dict.fromkeys(
        ["holder", "waiting", *others], "Succeeded"
    )


def test_lowering_a_pool_holds_admissions_only(env):
    go_a, go_b = env.root / "go-a", env.root / "go-b"
    env.controller()
    env.apply("pool.yaml", pool_yaml("shrink", 2))
    env.apply(
        "ab.yaml",
        docs(job_yaml("a", held_until(go_a) + "\npool: shrink"), job_yaml("b", held_until(go_b) + "\npool: shrink")),
    )
    env.wait_phase("a", "Running")
    env.wait_phase("b", "Running")
    env.apply("c.yaml", job_yaml("c", "command: ['true']\npool: shrink"))
    env.wait_status("c", lambda s: s.get("message") == "shrink: 2/2 slots in use, 1 needed", what="c held")

    assert "configured" in env.apply("pool.yaml", pool_yaml("shrink", 1)).stdout
    go_a.touch()
    env.wait_phase("a", "Completed")
    # one slot is free again, but the pool now has one: c is looked at again and held
    env.wait_status(
        "c", lambda s: s.get("message") == "shrink: 1/1 slots in use, 1 needed", what="c held by the lower limit"
    )
    assert env.status("b")["phase"] == "Running" and not env.status("c").get("runs")
    go_b.touch()
    env.wait_completed()
    jobs = env.jobs()
    assert {n: j["status"]["outcome"] for n, j in jobs.items()} == {
        "a": "Succeeded",
        "b": "Succeeded",
        "c": "Succeeded",
    }
    assert [r["outcome"] for n in "ab" for r in jobs[n]["status"]["runs"]] == ["Succeeded", "Succeeded"]
    assert _start(jobs, "c") >= epoch(jobs["b"]["status"]["runs"][0]["finishedAt"]) - STAMP


def test_an_unschedulable_job_does_not_hold_the_line(env):
    """Regression: a job no node can take (pinned to a missing node) at the head of a finite
    scope used to be passed maxBypass times and then block every younger job for good."""
    env.controller()
    env.apply(
        "pinned.yaml",
        docs(
            pool_yaml("global", 2, max_bypass=1),
            job_yaml("pinned", "command: ['true']\nplacement: {nodeName: worker-9}"),
        ),
    )
    env.wait_status("pinned", lambda s: s.get("reason") == "Unschedulable", what="Unschedulable")
    others = [f"later-{i}" for i in range(3)]
    env.apply("later.yaml", docs(*(job_yaml(n, "command: ['true']") for n in others)))
    env.wait_completed(*others)
    status = env.status("pinned")
    assert (status["phase"], status["reason"]) == ("Queued", "Unschedulable")
