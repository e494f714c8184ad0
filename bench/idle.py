"""Figure 5: idle cost. The controller (the real verb, `reconciler controller`, as a subprocess)
on a store holding N jobs that each wait for a file that never appears (path condition,
1 s poll interval). Once every job has been looked at and the process has settled, its CPU
time (user + system, all threads) is read over a window and reported as percent of one core.
Beside it, the same measurement of a controller on an empty store (its floor: heartbeat,
change watcher). Also counted: store writes during the window (change sequence).

    .venv/bin/python bench/idle.py                      # 5,000 jobs, settle 10 s, 30 s window
    .venv/bin/python bench/idle.py --jobs 200 --settle 1 --seconds 3
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Controller, Row, log, print_table, scratch, sql_scalar, wait_for

AIM = 5.0  # percent of one core
WAITING = '%"reason":"WaitingForConditions"%'


def waiting_jobs_yaml(n: int, prefix: str = "idle", interval: str = "1s") -> str:
    missing = f"/nonexistent/reconciler-bench-{uuid.uuid4().hex[:8]}"
    return "---\n".join(
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: {prefix}-{i:06d}}}\n"
        f"spec:\n  command: [/bin/true]\n"
        f"  waitFor: {{conditions: [{{path: {missing}/{prefix}-{i}, interval: {interval}}}]}}\n"
        for i in range(n)
    )


def apply_text(url: str, text: str, folder: Path) -> None:
    from reconciler.apply import apply_manifests
    from reconciler.manifests import parse_text
    from reconciler.store import Store

    manifests, problems = parse_text(text, "bench.yaml", folder)
    if problems:
        raise RuntimeError(problems[:3])
    store = Store(url)
    try:
        apply_manifests(store, manifests)
    finally:
        store.dispose()


def waiting_count(store) -> int:
    return int(sql_scalar(store, "SELECT count(*) FROM objects WHERE kind = 'Job' AND status LIKE :p", p=WAITING))


def cpu_window(url: str, folder: Path, jobs: int, settle: float, seconds: float, label: str) -> dict:
    """Start a controller, wait until all `jobs` were reconciled once, settle, then measure."""
    import psutil

    from reconciler.store import Store

    store = Store(url)
    try:
        with Controller(url, folder, name=label) as controller:
            controller.wait_started()
            t0 = time.monotonic()
            wait_for(
                lambda: controller.check() or waiting_count(store) >= jobs,
                max(120.0, jobs * 0.05),
                0.2,
                f"{jobs} jobs evaluated",
            )
            first_pass = time.monotonic() - t0
            time.sleep(settle)
            controller.check()
            proc = psutil.Process(controller.pid)
            threads = proc.num_threads()
            seq0, c0, w0 = store.change_seq(), proc.cpu_times(), time.monotonic()
            time.sleep(seconds)
            seq1, c1, w1 = store.change_seq(), proc.cpu_times(), time.monotonic()
            controller.check()
            rss = proc.memory_info().rss
    finally:
        store.dispose()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    wall = w1 - w0
    return {
        "percent": cpu / wall * 100,
        "cpu": cpu,
        "wall": wall,
        "writes": seq1 - seq0,
        "first_pass": first_pass,
        "threads": threads,
        "rss_mb": rss / 2**20,
    }


def figures(jobs: int, settle: float, seconds: float, store_kind: str = "sqlite") -> dict:
    with scratch(store_kind) as (url, folder):
        log(f"idle: reference, a controller on an empty store ({seconds:g} s window)")
        empty = cpu_window(url, folder, 0, min(settle, 3.0), seconds, "empty")
    with scratch(store_kind) as (url, folder):
        t0 = time.perf_counter()
        apply_text(url, waiting_jobs_yaml(jobs), folder)
        log(
            f"idle: {jobs} waiting jobs applied in {time.perf_counter() - t0:.1f} s; settle {settle:g} s, "
            f"window {seconds:g} s"
        )
        loaded = cpu_window(url, folder, jobs, settle, seconds, "loaded")
    return {"empty": empty, "loaded": loaded}


def row(jobs: int, settle: float, seconds: float, store_kind: str = "sqlite") -> Row:
    f = figures(jobs, settle, seconds, store_kind)
    e, lo = f["empty"], f["loaded"]
    label = f"5 idle cost ({store_kind})"
    notes = [
        f"{label}: {jobs} jobs waiting on missing paths (1 s poll); first pass over all of them "
        f"{lo['first_pass']:.1f} s; window {lo['wall']:.1f} s: CPU {lo['cpu']:.2f} s, {lo['writes']} store writes "
        f"({lo['writes'] / lo['wall']:.0f}/s), {lo['threads']} threads, RSS {lo['rss_mb']:.0f} MB; "
        f"empty-store controller: CPU {e['cpu']:.2f} s, {e['writes']} writes"
    ]
    return Row(
        label,
        f"{lo['percent']:.1f}% of a core, {jobs:,} waiting",
        f"{e['percent']:.1f}% with no jobs",
        lo["percent"],
        "%",
        AIM,
        notes,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--store", choices=("sqlite", "pg"), default="sqlite")
    args = parser.parse_args(argv)
    print_table([row(args.jobs, args.settle, args.seconds, args.store)])


if __name__ == "__main__":
    main()
