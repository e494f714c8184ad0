"""Figure 8, the CLI's read verbs: the wall time of whole commands, as a user waits for them.

`reconciler get job NAME`, `get jobs` and `describe job NAME`, each a fresh interpreter, on
a SQLite store of N jobs, timed in interleaved rounds (median of each) beside the floor of
any Python CLI on this machine in the same rounds: `python -c 'import yaml'`. Aim (issue 9):
`get job NAME` in at most 0.35 s on 2,000 jobs.

    .venv/bin/python bench/cli.py --jobs 2000 --rounds 15
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

AIM = 0.35  # seconds, for `get job NAME` (issue 9)


def fill(url: str, jobs: int) -> None:
    """N stored jobs, applied in process (what is measured is reading them back)."""
    text = "---\n".join(
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: job-{i}, labels: {{n: '{i % 7}'}}}}\n"
        f"spec: {{command: [/bin/true], priority: {i % 3}}}\n"
        for i in range(jobs)
    )
    apply_text(url, text)


def apply_text(url: str, text: str) -> None:
    """Apply these manifests (YAML text) to the store, in process."""
    from reconciler.apply import apply_manifests
    from reconciler.manifests import parse_text
    from reconciler.store import Store

    manifests, problems = parse_text(text, "jobs.yaml", Path.cwd())
    if problems:
        raise RuntimeError(problems[0])
    store = Store(url)
    try:
        apply_manifests(store, manifests)
    finally:
        store.dispose()


def timed(command: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:])} exited {proc.returncode}: {proc.stderr[-300:]!r}")
    return elapsed


def measure(jobs: int, rounds: int) -> dict[str, float]:
    """Median wall time of each command over `rounds` interleaved rounds."""
    reconciler = [PYTHON, "-m", "reconciler"]
    probe = f"job-{jobs // 2}"
    commands = {
        "get job NAME": [*reconciler, "get", "job", probe],
        "get jobs": [*reconciler, "get", "jobs"],
        "describe job NAME": [*reconciler, "describe", "job", probe],
        "python -c 'import yaml'": [PYTHON, "-c", "import yaml"],
    }
    with scratch("sqlite") as (url, _):
        log(f"cli: {jobs} jobs stored; {rounds} rounds of {len(commands)} commands")
        fill(url, jobs)
        env = {**os.environ, "RECONCILER_STORE": url}
        for command in commands.values():  # warm the page cache and the bytecode
            timed(command, env)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(rounds):
            for name, command in commands.items():
                samples[name].append(timed(command, env))
    return {name: statistics.median(values) for name, values in samples.items()}


def row(jobs: int, rounds: int, *, full: bool) -> Row:
    figures = measure(jobs, rounds)
    floor = figures["python -c 'import yaml'"]
    got = figures["get job NAME"]
    return Row(
        "8 CLI get job NAME (sqlite)",
        f"{got:.3f} s on {jobs:,} jobs",
        f"python+yaml {floor:.3f} s",
        got,
        "s",
        AIM if full else None,
        [
            f"8 CLI read verbs (sqlite): median of {rounds} interleaved rounds, each command a fresh interpreter on "
            f"{jobs:,} stored jobs: "
            + ", ".join(f"{name} {value:.3f} s" for name, value in figures.items())
            + f"; get job NAME - the interpreter and yaml floor = {got - floor:.3f} s"
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    result = row(args.jobs, args.rounds, full=True)
    print(result.reconciler, "|", result.reference, "|", result.result_text(), "|", *result.notes)


if __name__ == "__main__":
    main()
