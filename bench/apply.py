"""Benchmark `apply`: N generated Job manifests, first apply on a fresh store, then the
unchanged re-apply (which must report every object unchanged and write nothing).

    .venv/bin/python bench/apply.py                     # 10,000 jobs, in-process, temp SQLite store
    .venv/bin/python bench/apply.py --jobs 200          # the quick CI size
    .venv/bin/python bench/apply.py --cli               # also through the real CLI (a subprocess)
    .venv/bin/python bench/apply.py --files per-job     # one file per job instead of multi-document files
    .venv/bin/python bench/apply.py --store postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/apply.py --profile           # pyinstrument profile of each in-process phase

A PostgreSQL URL names the server: the benchmark creates a scratch database there and drops
it afterwards (`--in-place` uses the named database itself, which must hold no objects).
Prints figures; asserts only correctness (counts, unchanged re-apply, change sequence).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import discard

POOLS = {"analysis": 8, "io": 4, "gpu": 2, "batch": "unlimited"}
PIPELINES = ["ingest", "shards", "report", "ci", "nightly", "etl"]
PER_FILE = 500  # documents per multi-document file


# --------------------------------------------------------------------------- generation


def job_document(i: int, rng: random.Random) -> dict:
    name = f"job-{i:05d}"
    pipeline = PIPELINES[i % len(PIPELINES)]
    labels = {"pipeline": pipeline, "shard": str(i % 16), "tier": rng.choice(["fast", "slow", "bulk"])}
    spec: dict = {}
    if rng.random() < 0.8:
        spec["command"] = ["python", "analyze.py", "--shard", str(i % 16), "--input", f"data/part-{i}.csv"]
    else:
        spec["shell"] = f"make -C build target-{i % 50} && ./check.sh {i}"
    if rng.random() < 0.3:
        spec["env"] = {"LOG_LEVEL": rng.choice(["debug", "info"]), "SHARD": str(i % 16)}
    if rng.random() < 0.25:
        spec["workingDir"] = f"work/{pipeline}"
    if i > 0 and rng.random() < 0.4:  # edges only to earlier jobs: the graph stays acyclic
        edges = []
        for target in sorted({rng.randrange(max(0, i - 200), i) for _ in range(rng.randint(1, 3))}):
            dep = f"job-{target:05d}"
            roll = rng.random()
            if roll < 0.6:
                edges.append(dep)
            elif roll < 0.85:
                edges.append({"job": dep, "outcomes": ["Succeeded", "Failed"]})
            else:
                edges.append({"job": dep, "outcomes": ["Finished"]})
        spec["dependsOn"] = edges
    if rng.random() < 0.3:
        pool = rng.choice(list(POOLS))
        spec["pool"] = pool
        cap = POOLS[pool]
        spec["slots"] = 1 if cap == "unlimited" else rng.randint(1, min(2, cap))
    if rng.random() < 0.4:
        retry: dict = {"limit": rng.randint(1, 5)}
        if rng.random() < 0.5:
            retry["onExitCodes"] = sorted(rng.sample([1, 2, 75, 137, 143], 2))
        if rng.random() < 0.5:
            retry["backoff"] = {
                "policy": rng.choice(["constant", "linear", "exponential"]),
                "delay": rng.choice(["500ms", "1s", "5s"]),
                "maxDelay": "1m",
                "jitter": "200ms",
            }
        retry["onTimeout"] = rng.random() < 0.3
        spec["retry"] = retry
    if rng.random() < 0.3:
        spec["timeout"] = rng.choice(["30m", "1h", "2h30m"])
        spec["runTimeout"] = rng.choice(["5m", "10m"])
    if rng.random() < 0.2:
        spec["priority"] = rng.randint(-5, 10)
    if rng.random() < 0.2:
        spec["resources"] = {"cpu": rng.choice(["500m", "1", "2"]), "memory": rng.choice(["256Mi", "1Gi"])}
    if rng.random() < 0.05:
        spec["waitFor"] = {"conditions": [{"delay": "30s"}], "abortAfter": "2h"}
    document = {
        "apiVersion": "reconciler.dev/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }
    if rng.random() < 0.1:
        document["metadata"]["annotations"] = {"owner": f"team-{i % 7}"}
    return document


def pool_documents() -> list[dict]:
    return [
        {"apiVersion": "reconciler.dev/v1alpha1", "kind": "Pool", "metadata": {"name": name}, "spec": {"slots": slots}}
        for name, slots in POOLS.items()
    ]


def generate(folder: Path, jobs: int, files: str, seed: int) -> int:
    """Write the manifests; returns the number of objects."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    dump = lambda docs: yaml.dump_all(docs, Dumper=dumper, sort_keys=False, default_flow_style=None)  # noqa: E731
    (folder / "00-pools.yaml").write_text(dump(pool_documents()))
    documents = [job_document(i, rng) for i in range(jobs)]
    if files == "per-job":
        for doc in documents:
            (folder / f"{doc['metadata']['name']}.yaml").write_text(dump([doc]))
    else:
        for start in range(0, jobs, PER_FILE):
            (folder / f"jobs-{start // PER_FILE:03d}.yaml").write_text(dump(documents[start : start + PER_FILE]))
    return jobs + len(POOLS)


# --------------------------------------------------------------------------- stores


@contextmanager
def scratch_store(url: str | None, in_place: bool) -> Iterator[str]:
    if url is None:
        folder = Path(tempfile.mkdtemp(prefix="reconciler-bench-store-"))
        try:
            yield f"sqlite:///{folder / 'state.db'}"
        finally:
            discard(folder)
        return
    if url.startswith("sqlite") or in_place:
        yield url
        return
    import psycopg

    name = f"reconciler_bench_{uuid.uuid4().hex[:10]}"
    base, _, _db = url.rpartition("/")
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def count_objects(url: str) -> int:
    from reconciler.store import Store
    from reconciler.store.dbapi import Statement

    store = Store(url)
    try:
        with store.read() as session:
            return int(Statement("SELECT count(*) FROM objects").execute(session).scalar())
    finally:
        store.dispose()


# --------------------------------------------------------------------------- runs


@contextmanager
def maybe_profile(enabled: bool, label: str) -> Iterator[None]:
    if not enabled:
        yield
        return
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001)
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        print(f"\n==== profile: {label} ====")
        print(profiler.output_text(unicode=True, color=False, show_all=False))


def in_process(url: str, folder: Path, objects: int, profile: bool) -> dict[str, float]:
    from reconciler.apply import apply_manifests
    from reconciler.manifests import load
    from reconciler.store import Store

    figures: dict[str, float] = {}
    store = Store(url)
    try:
        if count_objects(url):
            raise SystemExit(f"store {url} is not empty; the first apply must start from a fresh store")
        for label, expected in (("first", "created"), ("reapply", "unchanged")):
            seq_before = store.change_seq()
            with maybe_profile(profile, f"{label} apply"):
                c0, t0 = time.process_time(), time.perf_counter()
                manifests = load([str(folder)])
                t1 = time.perf_counter()
                changes = apply_manifests(store, manifests)
                c2, t2 = time.process_time(), time.perf_counter()
            actions = {c.action for c in changes}
            if len(changes) != objects or actions != {expected}:
                raise SystemExit(f"{label}: expected {objects} x {expected}, got {len(changes)} {sorted(actions)}")
            seq_after = store.change_seq()
            if label == "reapply" and seq_after != seq_before:
                raise SystemExit(f"re-apply wrote something: change sequence {seq_before} -> {seq_after}")
            if label == "first" and seq_after == seq_before:
                raise SystemExit("first apply did not move the change sequence")
            figures[f"{label}.load"] = t1 - t0
            figures[f"{label}.store"] = t2 - t1
            figures[f"{label}.total"] = t2 - t0
            figures[f"{label}.cpu"] = c2 - c0
            del manifests, changes
        if count_objects(url) != objects:
            raise SystemExit("object count in the store does not match")
    finally:
        store.dispose()
    return figures


def through_cli(url: str, folder: Path, objects: int) -> dict[str, float]:
    """The two applies through `python -m reconciler`, and (`startup`) what every CLI call pays
    whatever it applies: interpreter, imports, opening the store, exit (the same verb on a file
    without documents, on a fresh SQLite store: an apply reads every stored object)."""
    from reconciler.store import Store

    figures: dict[str, float] = {}
    env = {**os.environ, "RECONCILER_STORE": url}
    store = Store(url)
    try:
        if count_objects(url):
            raise SystemExit(f"store {url} is not empty; the first apply must start from a fresh store")
        for label, expected in (("first", "created"), ("reapply", "unchanged")):
            seq_before = store.change_seq()
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "reconciler", "apply", "-f", str(folder)],
                capture_output=True,
                text=True,
                env=env,
                cwd=folder.parent,
            )  # not shadowed by ./reconciler
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"cli {label} apply failed ({proc.returncode}): {proc.stderr[-2000:]}")
            lines = proc.stdout.splitlines()
            if len(lines) != objects or not all(line.endswith(f" {expected}") for line in lines):
                raise SystemExit(f"cli {label}: expected {objects} lines ending {expected!r}")
            if label == "reapply" and store.change_seq() != seq_before:
                raise SystemExit("cli re-apply wrote something: the change sequence moved")
            figures[f"{label}.total"] = elapsed
    finally:
        store.dispose()
    figures["startup.total"] = cli_startup(folder.parent)
    return figures


def cli_startup(work: Path) -> float:
    """Wall time of `apply -f` of one unchanged object on a fresh SQLite store in `work`: the
    CLI's fixed cost (an apply of nothing at all is refused, as kubectl refuses it)."""
    one, scratch = work / "one.yaml", work / "startup-store"
    one.write_text(yaml.safe_dump(pool_documents()[0], sort_keys=False))
    try:
        env = {**os.environ, "RECONCILER_STORE": f"sqlite:///{scratch / 'state.db'}"}
        command = [sys.executable, "-m", "reconciler", "apply", "-f", str(one)]
        subprocess.run(command, capture_output=True, env=env, cwd=work, check=True)  # stored beforehand
        t0 = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or "unchanged" not in proc.stdout:
            raise SystemExit(f"cli apply of one object: exit {proc.returncode}, stdout {proc.stdout[:200]!r}")
        return elapsed
    finally:
        discard(one)
        discard(scratch)


def best_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per figure, the best run: on a shared machine the noise only ever adds time."""
    return {key: min(run[key] for run in runs) for key in runs[0]}


def report(title: str, figures: dict[str, float], objects: int) -> None:
    print(f"\n{title}")
    for label, name in (("first", "first apply (fresh store)"), ("reapply", "unchanged re-apply")):
        total = figures[f"{label}.total"]
        parts = ""
        if f"{label}.load" in figures:
            parts = (
                f"  (load+validate {figures[f'{label}.load']:.2f} s, store {figures[f'{label}.store']:.2f} s;"
                f" CPU {figures[f'{label}.cpu']:.2f} s)"
            )
        print(f"  {name:28s} {total:7.2f} s  {objects / total:9.0f} objects/s{parts}")
    if "startup.total" in figures:
        print(
            f"  {'start-up and exit':28s} {figures['startup.total']:7.2f} s  (paid by each call: the same verb "
            "on a file without documents, fresh store)"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="number of Job manifests (default 10000)")
    parser.add_argument(
        "--files",
        choices=("multi", "per-job"),
        default="multi",
        help=f"multi: {PER_FILE} documents per file (default); per-job: one file per job",
    )
    parser.add_argument("--store", default=None, help="store URL (default: a temporary SQLite file)")
    parser.add_argument("--in-place", action="store_true", help="with a PostgreSQL URL: use that database as is")
    parser.add_argument("--cli", action="store_true", help="also time the real CLI (python -m reconciler apply)")
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process run")
    parser.add_argument("--profile", action="store_true", help="print a pyinstrument profile of the in-process run")
    parser.add_argument("--repeat", type=int, default=1, help="run each mode N times on fresh stores; report the best")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.in_place and args.repeat * (2 - args.no_in_process - (not args.cli)) > 1:
        parser.error("--in-place allows one run: every run needs an empty store")

    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-"))
    try:
        t0 = time.perf_counter()
        objects = generate(work / "manifests", args.jobs, args.files, args.seed)
        files = len(list((work / "manifests").iterdir()))
        print(
            f"generated {objects} objects ({args.jobs} jobs, {len(POOLS)} pools) in {files} files "
            f"in {time.perf_counter() - t0:.2f} s; python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        best = f" (best of {args.repeat})" if args.repeat > 1 else ""
        scheme = (args.store or "sqlite").split(":", 1)[0]
        if not args.no_in_process:
            runs = []
            for _ in range(args.repeat):
                with scratch_store(args.store, args.in_place) as url:
                    runs.append(in_process(url, work / "manifests", objects, args.profile))
            report(f"in-process ({scheme}){best}", best_of(runs), objects)
        if args.cli:
            runs = []
            for _ in range(args.repeat):
                with scratch_store(args.store, args.in_place) as url:
                    runs.append(through_cli(url, work / "manifests", objects))
            report(f"CLI ({scheme}; includes interpreter start-up){best}", best_of(runs), objects)
    finally:
        discard(work)


if __name__ == "__main__":
    main()
