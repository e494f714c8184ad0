"""Two controllers on one SQLite store (API.md section 2, Admission and Crash safety):
8 short jobs in a pool of 2 slots, served by two `reconciler controller` processes at
once. Whichever controller admits or starts a run, never more than 2 run at once and
every job runs exactly once.

The scenario runs once per module; the tests below check different properties of it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from reconciler.store.dbapi import Statement
from tests.crash.harness import Env, intervals, job, marked, marker_runs, max_overlap, pool

JOBS = [f"w{i}" for i in range(8)]
QUEUED = Statement("SELECT job_name FROM queue")
PHASES = Statement("SELECT name, phase FROM objects WHERE kind = 'Job'")
HELD = Statement("SELECT job_name FROM admissions")


@dataclass
class Outcome:
    statuses: dict[str, dict]
    markers: dict
    peak_admissions: int
    queued_while_not_queued: set[tuple[str, str]]  # (job, phase) seen with a queue row
    admissions_left: list
    queue_left: list
    controllers_alive: list[bool]
    logs: str


@pytest.fixture(scope="module")
def two_controllers(tmp_path_factory) -> Outcome:
    env = Env(tmp_path_factory.mktemp("two-controllers"))
    try:
        markers = env.root / "markers"
        env.apply(pool("pair", 2), *[job(n, marked(markers, "sleep 0.3"), pool="pair") for n in JOBS])
        controllers = [env.start_controller(ready=False) for _ in range(2)]
        for c in controllers:
            c.wait_ready()
        # watch the tables while they work: one read transaction, one consistent snapshot
        peak, ghosts = 0, set()
        deadline = time.monotonic() + 60
        while True:
            with env.store.read() as conn:
                queued = [n for (n,) in QUEUED.execute(conn)]
                phases = dict(PHASES.execute(conn).all())
                held = HELD.execute(conn).all()
            peak = max(peak, len(held))
            ghosts |= {(n, phases.get(n)) for n in queued if phases.get(n) != "Queued"}
            if all(p == "Completed" for p in phases.values()):
                break
            assert time.monotonic() < deadline, f"not all jobs completed: {phases}\n{env.logs()}"
            time.sleep(0.01)  # polling interval
        return Outcome(
            {n: env.status(n) for n in JOBS},
            marker_runs(markers),
            peak,
            ghosts,
            env.admissions(),
            env.queue(),
            [c.proc.poll() is None for c in controllers],
            env.logs(),
        )
    finally:
        env.close()


def test_never_more_than_the_pool_and_every_job_exactly_once(two_controllers):
    out = two_controllers
    for name, status in out.statuses.items():
        assert status["outcome"] == "Succeeded", (name, status)
        assert [r["number"] for r in status["runs"]] == [1], f"{name} ran {len(status['runs'])} times"
    assert sorted(out.markers) == JOBS
    assert all(len(runs) == 1 and runs[0][2] is not None for runs in out.markers.values()), out.markers

    # the processes themselves, the run records and the admissions never exceed the pool
    process_spans = [(start, end) for runs in out.markers.values() for _, start, end in runs]
    assert max_overlap(process_spans) <= 2, sorted(process_spans)
    record_spans = [span for status in out.statuses.values() for span in intervals(status)]
    assert max_overlap(record_spans) <= 2, sorted(record_spans)
    assert out.peak_admissions <= 2

    assert out.admissions_left == [] and out.queue_left == []
    assert all(out.controllers_alive), f"a controller died:\n{out.logs}"
    assert "Traceback" not in out.logs, out.logs


def test_no_queue_row_for_a_job_that_is_not_queued(two_controllers):
    assert two_controllers.queued_while_not_queued == set()
