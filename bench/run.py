"""Run the benchmark suite and print one table: every figure measured side by side with its
reference in this one run, on this machine (these machines are noisy: only ratios hold).

    .venv/bin/python bench/run.py                 # full size (about 10 minutes on 2 cores)
    .venv/bin/python bench/run.py --small         # the CI size: keeps every benchmark working
    .venv/bin/python bench/run.py --only dag --only latency
    .venv/bin/python bench/run.py --no-pg         # PostgreSQL figures are on when the server answers

Figures: 1 dag (DAG throughput vs make -j N), 2 latency (dependency latency on a chain),
3 admission (admission cost at queue depth), 4 apply (10,000 manifests, then the unchanged
re-apply), 5 idle (controller CPU with waiting jobs), 6 memory (peak RSS with 100,000 stored
jobs), 8 cli (the read verbs' wall time), 9 apply-one (one job into 1,000 and 100,000 stored
jobs), 10 notify (notifier delivery: events/s, completion-to-arrival latency), 11 api (`get jobs`
through `serve` against straight from the store), 12 metrics (a /metrics scrape at 100,000 jobs),
13 chain (time per link of a 300-job chain from whole commands' wall times, beside doit and
make), 14 dashboard (each view's page at 2,000 jobs, beside the API's list),
15 ingest (jobs from a RabbitMQ queue: messages/s against a plain pika consumer),
16 cgroups (starting a run with its cgroup against without),
19 start (a run's start and whole cost under the C wrapper, the sh wrapper and a bare Popen),
7 pg (figures 1, 3 and 13 on PostgreSQL, and 17: a write to watch event and admission on PostgreSQL,
LISTEN/NOTIFY against the poll, and 20: a burn-down of 10,000 no-op jobs over three agents in network
namespaces against the embedded controller, jobs/s), 18 agents (1,000 jobs over three agents in network namespaces
against the embedded controller, and placement-to-start latency on a remote agent). Prints
figures; never asserts a time. Exit
status 1 when a figure could not be measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PG_URL, Row, byte_compile, failed_row, log, mark_start, pg_available, print_table

FULL = {
    "dag": dict(jobs=2000, width=50),
    "latency": dict(jobs=300),
    "admission": dict(depths=[100, 10_000], reps=300),
    "apply": dict(jobs=10_000),
    "idle": dict(jobs=5000, settle=10.0, seconds=30.0),
    "memory": dict(jobs=100_000, active=1000, settle=5.0),
    "cli": dict(jobs=2000, rounds=15),
    "apply-one": dict(small=1000, large=100_000, rounds=5),
    "notify": dict(events=2000, jobs=300),
    "api": dict(jobs=10_000, rounds=5),
    "metrics": dict(small=1000, large=100_000, rounds=7),
    "chain": dict(jobs=300, rounds=3),
    "dashboard": dict(jobs=2000, rounds=7),
    "ingest": dict(messages=10000, rounds=3),
    "wakeup": dict(jobs=100),
    "cgroups": dict(runs=200, rounds=5),
    "start": dict(runs=500, rounds=4),
    "agents": dict(jobs=1000),
    "burndown": dict(jobs=10_000),
}
SMALL = {
    "dag": dict(jobs=60, width=6),
    "latency": dict(jobs=30),
    "admission": dict(depths=[10, 200], reps=60),
    "apply": dict(jobs=200),
    "idle": dict(jobs=200, settle=0.5, seconds=2.0),
    "memory": dict(jobs=2000, active=20, settle=0.5),
    "cli": dict(jobs=100, rounds=2),
    "apply-one": dict(small=100, large=1000, rounds=2),
    "notify": dict(events=100, jobs=20),
    "api": dict(jobs=100, rounds=2),
    "metrics": dict(small=100, large=2000, rounds=2),
    "chain": dict(jobs=20, rounds=1),
    "dashboard": dict(jobs=400, rounds=2),
    "ingest": dict(messages=2000, rounds=1),
    "wakeup": dict(jobs=10),
    "cgroups": dict(runs=20, rounds=2),
    "start": dict(runs=20, rounds=3),
    "agents": dict(jobs=60),
    "burndown": dict(jobs=200),
}
NAMES = (
    "dag",
    "latency",
    "admission",
    "apply",
    "idle",
    "memory",
    "cli",
    "apply-one",
    "notify",
    "api",
    "metrics",
    "chain",
    "dashboard",
    "ingest",
    "cgroups",
    "start",
    "agents",
    "pg",
)
APPLY_AIMS = (10.0, 3.0)


def yaml_floor(folder: Path) -> float:
    """Reading the same manifest files with PyYAML's C loader: the floor any apply pays."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    t0 = time.perf_counter()
    count = 0
    for path in sorted(folder.iterdir()):
        with open(path) as f:
            count += sum(1 for _ in yaml.load_all(f, Loader=loader))
    return time.perf_counter() - t0


def apply_rows(jobs: int) -> list[Row]:
    """Figure 4 through bench/apply.py (its generator and its measurements): the real verb
    (`reconciler apply -f DIR`, a subprocess) is the figure; the in-process run gives the split."""
    import tempfile

    from bench import apply as apply_bench
    from bench.common import discard, scratch

    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-apply-"))
    try:
        folder = work / "manifests"
        objects = apply_bench.generate(folder, jobs, "multi", 1)
        floor = yaml_floor(folder)
        with scratch("sqlite") as (url, _):
            cli = apply_bench.through_cli(url, folder, objects)
        with scratch("sqlite") as (url, _):
            f = apply_bench.in_process(url, folder, objects, False)
    finally:
        discard(work)
    first, again = cli["first.total"], cli["reapply.total"]
    full = jobs == 10_000  # the aims are set for 10,000 manifests
    note = (
        f"4 apply (sqlite): {jobs:,} generated manifests ({objects:,} objects, bench/apply.py); figure = the CLI "
        f"`reconciler apply -f DIR` (a subprocess: interpreter start-up and output included); in-process: first "
        f"{f['first.total']:.2f} s (load+validate {f['first.load']:.2f} s + store {f['first.store']:.2f} s), "
        f"re-apply {f['reapply.total']:.2f} s (load {f['reapply.load']:.2f} s + store {f['reapply.store']:.2f} s); "
        f"reference = yaml.load_all (C loader) of the same files in this process"
    )
    return [
        Row(
            "4 apply, first (sqlite)",
            f"{first:.2f} s, {jobs:,} manifests",
            f"YAML parse {floor:.2f} s",
            first,
            "s",
            APPLY_AIMS[0] if full else None,
            [note],
        ),
        Row(
            "4 apply, unchanged again (sqlite)",
            f"{again:.2f} s, all unchanged",
            f"YAML parse {floor:.2f} s",
            again,
            "s",
            APPLY_AIMS[1] if full else None,
        ),
    ]


def figure(name: str, sizes: dict, slots: int, pg: bool) -> list[tuple[str, callable]]:
    """(row label, thunk returning rows) for one named figure."""
    from bench import (
        admission,
        agents,
        api,
        apply_one,
        burndown,
        cgroups,
        chain,
        cli,
        dag,
        dashboard,
        idle,
        ingest,
        latency,
        memory,
        metrics,
        notify,
        start,
        wakeup,
    )

    s = sizes
    out = {
        "dag": [
            (
                "1 DAG throughput (sqlite)",
                lambda: [dag.row("1 DAG throughput (sqlite)", s["dag"]["jobs"], s["dag"]["width"], slots, "sqlite")],
            )
        ],
        "latency": [("2 dependency latency (sqlite)", lambda: [latency.row(s["latency"]["jobs"])])],
        "admission": [
            (
                "3 admission at depth (sqlite)",
                lambda: admission.rows(
                    s["admission"]["depths"], "sqlite", "3 admission at depth (sqlite)", s["admission"]["reps"]
                ),
            )
        ],
        "apply": [("4 apply (sqlite)", lambda: apply_rows(s["apply"]["jobs"]))],
        "idle": [
            ("5 idle cost (sqlite)", lambda: [idle.row(s["idle"]["jobs"], s["idle"]["settle"], s["idle"]["seconds"])])
        ],
        "memory": [
            (
                "6 memory (sqlite)",
                lambda: [memory.row(s["memory"]["jobs"], s["memory"]["active"], s["memory"]["settle"])],
            )
        ],
        "cli": [
            (
                "8 CLI read verbs (sqlite)",
                lambda: [cli.row(s["cli"]["jobs"], s["cli"]["rounds"], full=sizes is FULL)],
            )
        ],
        "apply-one": [
            (
                "9 apply one job into a large store (sqlite)",
                lambda: [
                    apply_one.row(
                        s["apply-one"]["small"], s["apply-one"]["large"], s["apply-one"]["rounds"], full=sizes is FULL
                    )
                ],
            )
        ],
        "notify": [
            (
                "10 notifier delivery (sqlite)",
                lambda: [notify.row(s["notify"]["events"], s["notify"]["jobs"])],
            )
        ],
        "api": [
            ("11 CLI get jobs through the API (sqlite)", lambda: [api.row(s["api"]["jobs"], s["api"]["rounds"])]),
        ],
        "metrics": [
            (
                "12 metrics scrape of a large store (sqlite)",
                lambda: [
                    metrics.row(
                        s["metrics"]["small"], s["metrics"]["large"], s["metrics"]["rounds"], full=sizes is FULL
                    )
                ],
            )
        ],
        "chain": [
            ("13 chain per link (sqlite)", lambda: [chain.row(s["chain"]["jobs"], s["chain"]["rounds"])]),
        ],
        "dashboard": [
            (
                "14 dashboard pages (sqlite)",
                lambda: [dashboard.row(s["dashboard"]["jobs"], s["dashboard"]["rounds"])],
            )
        ],
        "ingest": [
            (
                "15 ingestion from RabbitMQ (sqlite)",
                lambda: [ingest.row(s["ingest"]["messages"], s["ingest"]["rounds"])],
            )
        ],
        "cgroups": [
            ("16 run start with a cgroup", lambda: [cgroups.row(s["cgroups"]["runs"], s["cgroups"]["rounds"])]),
        ],
        "start": [
            (
                "19 run start, C fork server against the exec'd C wrapper",
                lambda: [start.row(s["start"]["runs"], s["start"]["rounds"])],
            ),
        ],
        "agents": [("18 remote agents (sqlite)", lambda: agents.rows(s["agents"]["jobs"]))],
        "pg": [
            (
                "7 DAG throughput (postgresql)",
                lambda: [dag.row("7 DAG throughput (postgresql)", s["dag"]["jobs"], s["dag"]["width"], slots, "pg")],
            ),
            (
                "7 admission at depth (postgresql)",
                lambda: admission.rows(
                    s["admission"]["depths"], "pg", "7 admission at depth (postgresql)", s["admission"]["reps"]
                ),
            ),
            ("13 chain per link (postgresql)", lambda: [chain.row(s["chain"]["jobs"], s["chain"]["rounds"], "pg")]),
            ("17 wake-up after a write (postgresql)", lambda: [wakeup.row(s["wakeup"]["jobs"])]),
            ("20 burn-down over agents (postgresql)", lambda: [burndown.row(s["burndown"]["jobs"])]),
        ],
    }
    return out[name] if (name != "pg" or pg) else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the CI size")
    parser.add_argument("--only", action="append", choices=NAMES, help="run only this figure (repeatable)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--pg",
        dest="pg",
        action="store_true",
        default=None,
        help=f"include the PostgreSQL figures (default: when {PG_URL} answers)",
    )
    group.add_argument("--no-pg", dest="pg", action="store_false")
    parser.add_argument(
        "--slots", type=int, default=os.cpu_count() or 2, help="N for figure 1: global pool and make -j"
    )
    args = parser.parse_args(argv)

    pg = pg_available() if args.pg is None else args.pg
    if args.pg and not pg_available():
        parser.error(f"--pg: PostgreSQL does not answer at {PG_URL} (set RECONCILER_BENCH_PG)")
    sizes = SMALL if args.small else FULL
    names = args.only or list(NAMES)
    if "pg" in names and not pg:
        log("PostgreSQL figures skipped: " + ("--no-pg" if args.pg is False else f"no server at {PG_URL}"))
    rows: list[Row] = []
    byte_compile()
    mark_start()
    started = time.perf_counter()
    for name in NAMES:
        if name not in names:
            continue
        for label, thunk in figure(name, sizes, args.slots, pg):
            log(f"figure {label} ...")
            t0 = time.perf_counter()
            try:
                rows.extend(thunk())
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                rows.append(failed_row(label, exc))
            log(f"figure {label} done in {time.perf_counter() - t0:.1f} s")
    size = "small (CI) size" if args.small else "full size"
    print_table(
        rows,
        title=f"reconciler benchmarks, {size}, {time.perf_counter() - started:.0f} s "
        f"(one run; every figure beside its reference)",
    )
    return 1 if any(r.reconciler == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
