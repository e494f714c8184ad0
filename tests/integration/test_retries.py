"""Retries: retryable exit codes, the retry limit, backoff delays honoured (from run
records), run numbers never reused."""

from __future__ import annotations

import itertools

from .conftest import STAMP, docs, epoch, job_yaml


def _gaps(runs: list[dict]) -> list[float]:
    return [epoch(b["startedAt"]) - epoch(a["finishedAt"]) for a, b in itertools.pairwise(runs)]


def test_retry_policy(env):
    manifest = env.write(
        "retries.yaml",
        docs(
            job_yaml(
                "not-retryable",
                "command: [sh, -c, 'exit 3']\nretry: {limit: 3, onExitCodes: [1], backoff: {delay: 100ms}}",
            ),
            job_yaml(
                "exhausted",
                "command: [sh, -c, 'exit 1']\n"
                "retry: {limit: 2, onExitCodes: [1, 75], backoff: {policy: exponential, delay: 200ms, factor: 2}}",
            ),
            job_yaml(
                "constant", "command: [sh, -c, 'exit 9']\nretry: {limit: 1, backoff: {policy: constant, delay: 300ms}}"
            ),
        ),
    )
    result = env.up(manifest)
    assert result.code == 1, result.stderr
    jobs = env.jobs()
    assert {n: (j["status"]["outcome"], j["status"]["reason"]) for n, j in jobs.items()} == {
        "not-retryable": ("Failed", "NonRetryableExitCode"),
        "exhausted": ("Failed", "BackoffLimitExceeded"),
        "constant": ("Failed", "BackoffLimitExceeded"),
    }
    # 3 is not in onExitCodes: one run only
    assert [(r["number"], r["exitCode"], r["outcome"]) for r in jobs["not-retryable"]["status"]["runs"]] == [
        (1, 3, "Failed")
    ]
    # limit 2: limit + 1 runs, numbered 1..3, delays 200ms then 400ms (exponential)
    runs = jobs["exhausted"]["status"]["runs"]
    assert [(r["number"], r["revision"], r["exitCode"]) for r in runs] == [(1, 1, 1), (2, 1, 1), (3, 1, 1)]
    gaps = _gaps(runs)
    assert gaps[0] >= 0.2 - STAMP and gaps[1] >= 0.4 - STAMP, gaps
    # empty onExitCodes: every non-zero code is retryable
    runs = jobs["constant"]["status"]["runs"]
    assert [r["exitCode"] for r in runs] == [9, 9]
    assert _gaps(runs)[0] >= 0.3 - STAMP
    assert all(j["status"].get("nextRunAt") is None for j in jobs.values())
