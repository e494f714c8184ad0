"""The seed pipeline (examples/shards) converges under `up`, within its capacity limits."""

from __future__ import annotations

import shutil

from .conftest import REPO_ROOT, STAMP, epoch, max_concurrent, run_intervals

SHARDS = [f"analyze-{i}" for i in range(1, 5)]


def test_shards_converge_within_limits(any_env):
    env = any_env
    folder = env.root / "shards"
    shutil.copytree(REPO_ROOT / "examples" / "shards", folder, ignore=shutil.ignore_patterns("work"))

    result = env.up(folder)
    assert result.code == 0, result.stderr
    jobs = env.jobs()
    assert {n: j["status"]["outcome"] for n, j in jobs.items()} == dict.fromkeys(["prepare-data", *SHARDS], "Succeeded")

    # capacity, from the recorded run times: pool analysis 2, global 4
    assert max_concurrent(run_intervals(jobs, SHARDS)) <= 2
    assert max_concurrent(run_intervals(jobs)) <= 4

    # prepare-data finished before any shard started
    prepared = epoch(jobs["prepare-data"]["status"]["runs"][-1]["finishedAt"])
    assert all(start >= prepared for start, _, _, _ in run_intervals(jobs, SHARDS))

    # the flaky shard: run 1 exit 1, run 2 (same revision) at least the 1 s backoff later
    runs = jobs["analyze-3"]["status"]["runs"]
    assert [(r["number"], r["revision"], r["exitCode"], r["outcome"]) for r in runs] == [
        (1, 1, 1, "Failed"),
        (2, 1, 0, "Succeeded"),
    ]
    assert epoch(runs[1]["startedAt"]) - epoch(runs[0]["finishedAt"]) >= 1.0 - STAMP
    assert all(len(jobs[n]["status"]["runs"]) == 1 for n in ["prepare-data", "analyze-1", "analyze-2", "analyze-4"])

    # and the work was done, in the manifest's folder
    expected = {i: sum(range((i - 1) * 250 + 1, i * 250 + 1)) for i in range(1, 5)}
    assert {i: int((folder / "work" / f"result-{i}.txt").read_text()) for i in range(1, 5)} == expected
