"""Figure 14, the dashboard at 2,000 jobs: the wall time of each view's HTML fragment as the
browser fetches it from `serve` (the graph, grouped beyond 300 jobs; the jobs table's first
page; one job's page; the pools page with its queue), beside the API's own `GET jobs` list
of the same store (the JSON every client reads), medians of interleaved rounds from a warm
connection. The jobs form a DAG 20 deep (job i depends on job i-100), all in one pool; the
server runs --no-local-node, so they stay Queued and the store stays still.

    .venv/bin/python bench/dashboard.py --jobs 2000 --rounds 7
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.api import LIST, _quiet, _serve
from bench.cli import apply_text
from bench.common import Row, log, scratch

DEPTH_STEP = 100  # job i depends on job i - DEPTH_STEP


def fill(url: str, jobs: int) -> None:
    pool = "apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: batch}\nspec: {slots: 4}\n"
    text = "---\n".join(
        [pool]
        + [
            f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: job-{i:05d}}}\n"
            f"spec: {{command: [/bin/true], pool: batch"
            + (f", dependsOn: [job-{i - DEPTH_STEP:05d}]" if i >= DEPTH_STEP else "")
            + "}\n"
            for i in range(jobs)
        ]
    )
    apply_text(url, text)


def measure(jobs: int, rounds: int) -> dict[str, float]:
    import httpx

    pages = {
        "graph": "/ui/fragments/graph",
        "jobs table": "/ui/fragments/jobs",
        "job page": "/ui/fragments/jobs/job-00000",
        "pools": "/ui/fragments/pools",
        "GET jobs (API)": LIST,
    }
    with scratch("sqlite") as (url, folder):
        log(f"dashboard: {jobs} jobs stored; serve --no-local-node; {rounds} rounds")
        fill(url, jobs)
        proc, server = _serve(url, folder)
        try:
            _quiet(url, server, proc)
            samples: dict[str, list[float]] = {name: [] for name in pages}
            with httpx.Client(base_url=server, timeout=120) as client:
                for path in pages.values():  # warm
                    client.get(path).raise_for_status()
                if "data-group" not in client.get(pages["graph"]).text and jobs > 300:
                    raise RuntimeError("the graph of so many jobs is not grouped")
                for _ in range(rounds):
                    for name, path in pages.items():
                        t0 = time.perf_counter()
                        client.get(path).raise_for_status()
                        samples[name].append(time.perf_counter() - t0)
            return {name: statistics.median(values) * 1000 for name, values in samples.items()}
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def row(jobs: int, rounds: int) -> Row:
    ms = measure(jobs, rounds)
    slowest = max((name for name in ms if name != "GET jobs (API)"), key=lambda name: ms[name])
    return Row(
        "14 dashboard pages (sqlite)",
        f"slowest at {jobs:,} jobs: {slowest} {ms[slowest]:.0f} ms",
        f"GET jobs list {ms['GET jobs (API)']:.0f} ms",
        ms[slowest] / ms["GET jobs (API)"],
        "x",
        None,
        [
            f"14 dashboard (sqlite): each view's fragment from serve, median of {rounds} interleaved rounds "
            f"on {jobs:,} jobs: " + ", ".join(f"{name} {value:.0f} ms" for name, value in ms.items())
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    result = row(args.jobs, args.rounds)
    print(result.reconciler, "|", result.reference, "|", result.result_text(), "|", *result.notes)


if __name__ == "__main__":
    main()
