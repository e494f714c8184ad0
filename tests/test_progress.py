"""`up`'s line progress: one line per change of a job, naming the run it is about."""

from __future__ import annotations

import io

from reconciler.cli.progress import LineProgress
from reconciler.converge import Watched


def _lines(*statuses: dict) -> list[str]:
    out = io.StringIO()
    progress = LineProgress(out)
    for status in statuses:
        progress.update({"a": Watched(status)}, {"a"})
    return [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]  # without the time


def test_a_retry_being_started_is_named_by_its_own_run_number():
    failed = {"number": 1, "revision": 1, "finishedAt": "2026-12-06T10:00:01.000Z", "outcome": "Failed"}
    started = {"number": 2, "revision": 1, "startedAt": "2026-12-06T10:00:02.000Z"}
    assert _lines(
        {"phase": "Backoff", "reason": "RetryScheduled", "runs": [failed]},
        {"phase": "Starting", "reason": "Admitted", "runs": [failed]},  # run 2's record comes with its start
        {"phase": "Running", "reason": "Started", "runs": [failed, started]},
    ) == [
        "job/a Backoff run=1 (RetryScheduled)",
        "job/a Starting run=2 (Admitted)",
        "job/a Running run=2 (Started)",
    ]
