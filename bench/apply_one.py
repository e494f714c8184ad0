"""Figure 9, apply into a large store: the wall time of `reconciler apply -f` of one new job
(a whole command, as a user waits for it) into a store of 1,000 jobs and into one of
100,000, in interleaved rounds. An apply reads what the applied objects touch (their
names, the jobs their dependency edges reach, the pools they name), so its cost must not
grow with the store: aim (issue 16) a ratio of at most 1.5. The job depends on the last
jobs of two stored pipelines, so the cycle check's walk of what its edges reach is part of
what is timed.

    .venv/bin/python bench/apply_one.py --small 1000 --large 100000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, Row, log, scratch

AIM = 1.5
BATCH = 5000
SPEC = {"command": ["/bin/true"], "dependsOn": [], "slots": 1}


PIPELINE = 10  # stored jobs come in chains of this length, as pipelines do


def fill(url: str, jobs: int) -> None:
    """`jobs` stored jobs, written in bulk through the repository: stored-0 .. stored-N in
    pipelines of PIPELINE, each job depending on the one before it in its pipeline (what the
    cycle check walks from the applied job is its pipelines, not the store)."""
    from reconciler.api.status import new_job_status
    from reconciler.store import Store
    from reconciler.store import repository as repo

    store = Store(url)
    try:
        for start in range(0, jobs, BATCH):
            with store.write() as tx:
                repo.create_many(
                    tx,
                    [
                        {
                            "kind": "Job",
                            "name": f"stored-{i}",
                            "spec": {**SPEC, "dependsOn": [{"job": f"stored-{i - 1}", "outcomes": ["Succeeded"]}]}
                            if i % PIPELINE
                            else SPEC,
                            "labels": {},
                            "annotations": {"reconciler.dev/managed-by": "apply"},
                            "status": dict(new_job_status("2026-01-01T00:00:00.000Z")),
                        }
                        for i in range(start, min(jobs, start + BATCH))
                    ],
                )
    finally:
        store.dispose()


def apply_one(url: str, folder: Path, name: str, stored: int) -> float:
    manifest = folder / f"{name}.yaml"
    manifest.write_text(
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: {name}}}\n"
        f"spec: {{command: [/bin/true], dependsOn: [stored-{stored - 1}, stored-{stored // 2}]}}\n"
    )
    env = {**os.environ, "RECONCILER_STORE": url}
    t0 = time.perf_counter()
    proc = subprocess.run([PYTHON, "-m", "reconciler", "apply", "-f", str(manifest)], capture_output=True, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or b"created" not in proc.stdout:
        raise RuntimeError(f"apply into {stored} jobs: exit {proc.returncode}: {proc.stderr[-300:]!r}")
    return elapsed


def measure(small: int, large: int, rounds: int) -> dict[int, float]:
    with scratch("sqlite") as (small_url, small_dir), scratch("sqlite") as (large_url, large_dir):
        t0 = time.perf_counter()
        fill(small_url, small)
        fill(large_url, large)
        log(f"apply-one: {small:,} and {large:,} jobs stored in {time.perf_counter() - t0:.1f} s")
        apply_one(small_url, small_dir, "warm", small)  # page cache and bytecode
        apply_one(large_url, large_dir, "warm", large)
        samples: dict[int, list[float]] = {small: [], large: []}
        for i in range(rounds):
            samples[small].append(apply_one(small_url, small_dir, f"one-{i}", small))
            samples[large].append(apply_one(large_url, large_dir, f"one-{i}", large))
    return {size: statistics.median(values) for size, values in samples.items()}


def row(small: int, large: int, rounds: int, *, full: bool) -> Row:
    figures = measure(small, large, rounds)
    ratio = figures[large] / figures[small]
    return Row(
        "9 apply one job into a large store (sqlite)",
        f"{figures[large]:.3f} s into {large:,} jobs",
        f"{figures[small]:.3f} s into {small:,} jobs",
        ratio,
        "x",
        AIM if full else None,
        [
            f"9 apply into a large store (sqlite): `reconciler apply -f` of one new job depending on two stored "
            f"ones, median of {rounds} interleaved rounds: {figures[small]:.3f} s into {small:,} stored jobs, "
            f"{figures[large]:.3f} s into {large:,}"
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = row(args.small, args.large, args.rounds, full=True)
    print(result.reconciler, "|", result.reference, "|", result.result_text(), "|", *result.notes)


if __name__ == "__main__":
    main()
