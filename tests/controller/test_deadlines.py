"""deadlines.py: job, run and wait-abort deadlines as arithmetic on recorded times."""

from __future__ import annotations

import pytest

from reconciler.api.job import JobSpec
from reconciler.api.meta import from_epoch
from reconciler.clock import FakeClock
from reconciler.controller.deadlines import job_deadline, passed, run_deadline, soonest, wait_abort_deadline

T0 = FakeClock().now()  # acceptance time in every case


def spec(**fields) -> JobSpec:
    return JobSpec.model_validate({"command": ["true"], **fields})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"timeout": "30s"}, T0 + 30, id="timeout-from-acceptance"),
        pytest.param({"timeout": "1h30m"}, T0 + 5400, id="compound-duration"),
        pytest.param({}, T0 + 3600, id="run-job-default-1h"),
        pytest.param({"type": "service"}, None, id="service-has-no-timeout"),
        pytest.param({"type": "service", "timeout": "2m"}, T0 + 120, id="service-with-timeout"),
    ],
)
def test_job_deadline(fields, expected):
    assert job_deadline(spec(**fields), T0) == expected


@pytest.mark.parametrize(
    ("fields", "started_at", "expected"),
    [
        pytest.param({"runTimeout": "10m"}, T0 + 5, T0 + 5 + 600, id="from-run-start"),
        pytest.param({"runTimeout": "10m"}, None, None, id="not-started"),
        pytest.param({}, T0 + 5, None, id="no-run-timeout"),
        pytest.param({"runTimeout": "500ms"}, T0, T0 + 0.5, id="sub-second"),
    ],
)
def test_run_deadline(fields, started_at, expected):
    assert run_deadline(spec(**fields), started_at) == expected


@pytest.mark.parametrize(
    ("wait_for", "expected"),
    [
        pytest.param(None, None, id="no-waitFor"),
        pytest.param({"conditions": [{"delay": "1m"}]}, None, id="no-abort"),
        pytest.param({"conditions": [{"delay": "1m"}], "abortAfter": "2h"}, T0 + 7200, id="abortAfter-from-acceptance"),
        pytest.param(
            {"conditions": [{"delay": "1m"}], "abortAt": from_epoch(T0 + 900)}, T0 + 900, id="abortAt-absolute"
        ),
        pytest.param(
            {"conditions": [{"delay": "1m"}], "abortAt": "2026-12-01T06:00:00Z"},
            1_796_104_800.0,
            id="abortAt-before-acceptance-is-kept",
        ),
        pytest.param(
            {"conditions": [{"delay": "1m"}], "abortAt": "2027-01-15T09:00:00+01:00"}, T0, id="abortAt-with-offset"
        ),
    ],
)
def test_wait_abort_deadline(wait_for, expected):
    fields = {} if wait_for is None else {"waitFor": wait_for}
    assert wait_abort_deadline(spec(**fields), T0) == expected


def test_wait_abort_deadline_does_not_depend_on_acceptance_for_abort_at():
    s = spec(waitFor={"conditions": [{"delay": "1m"}], "abortAt": from_epoch(T0 + 60)})
    assert wait_abort_deadline(s, T0) == wait_abort_deadline(s, T0 + 1000) == T0 + 60


@pytest.mark.parametrize(
    ("deadline", "now", "expected"),
    [
        pytest.param(None, T0, False, id="no-deadline-never-passes"),
        pytest.param(T0 + 1, T0, False, id="before"),
        pytest.param(T0, T0, True, id="exactly-at"),
        pytest.param(T0 - 0.001, T0, True, id="after"),
    ],
)
def test_passed(deadline, now, expected):
    assert passed(deadline, now) is expected


def test_passed_follows_the_clock():
    clock = FakeClock()
    deadline = clock.now() + 10
    seen = []
    for _ in range(3):
        seen.append(passed(deadline, clock.now()))
        clock.advance(5)
    assert seen == [False, False, True]


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        pytest.param((), None, id="nothing"),
        pytest.param((None, None), None, id="only-none"),
        pytest.param((T0 + 30,), 30.0, id="one-future"),
        pytest.param((T0 + 30, None, T0 + 10, T0 + 20), 10.0, id="earliest-wins"),
        pytest.param((T0 - 5, T0 + 10), 0.0, id="past-time-is-due-now"),
        pytest.param((T0,), 0.0, id="now-is-due-now"),
    ],
)
def test_soonest(times, expected):
    assert soonest(T0, *times) == expected
