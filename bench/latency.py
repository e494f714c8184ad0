"""Dependency-to-start latency on a chain of jobs: job i+1 depends on job i.

Per link: (start of job i+1) - (recorded finish of job i), from the run records of one
`up`-style convergence on a fresh SQLite store; beside it, the same chain under `make`, run
in the same process, for the reference per-link cost of starting `/bin/true`.
Usage: python bench/latency.py [--jobs 200] [--store URL]"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def chain_manifests(n: int) -> str:
    docs = []
    for i in range(n):
        dep = f"\n  dependsOn: [link-{i - 1}]" if i else ""
        docs.append(f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: link-{i}}}\n"
                    f"spec:\n  command: [/bin/true]{dep}\n")
    return "---\n".join(docs)


def make_chain(n: int, folder: Path) -> float:
    lines = [".PHONY: all " + " ".join(f"l{i}" for i in range(n)), f"all: l{n - 1}"]
    for i in range(n):
        lines.append(f"l{i}:{' l' + str(i - 1) if i else ''}\n\t@/bin/true")
    (folder / "Makefile").write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    subprocess.run(["make", "-s", "-C", str(folder), "-j2", "all"], check=True)
    return time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(n: int, store_url: str | None, folder: Path) -> dict[str, float]:
    from reconciler.api.meta import to_epoch
    from reconciler.apply import apply_manifests
    from reconciler.controller.manager import Controller, job_phases
    from reconciler.manifests import parse_text
    from reconciler.store import Store

    store = Store(store_url or f"sqlite:///{folder / 'state' / 'state.db'}")
    manifests, problems = parse_text(chain_manifests(n), "chain.yaml", folder)
    assert not problems, problems
    apply_manifests(store, manifests)
    names = [f"link-{i}" for i in range(n)]
    start = time.perf_counter()
    controller = Controller(store).start()
    try:
        while True:
            statuses = job_phases(store, [names[-1]])
            if statuses[names[-1]].get("phase") == "Completed":
                break
            time.sleep(0.01)
    finally:
        controller.stop()
    wall = time.perf_counter() - start
    statuses = job_phases(store, names)
    gaps = []
    for before, after in zip(names, names[1:]):
        finished = to_epoch(statuses[before]["runs"][-1]["finishedAt"])
        started = to_epoch(statuses[after]["runs"][0]["startedAt"])
        gaps.append((started - finished) * 1000)
    outcomes = {s.get("outcome") for s in statuses.values()}
    assert outcomes == {"Succeeded"}, outcomes
    return {"wall": wall, "p50": statistics.median(gaps), "p99": percentile(gaps, 0.99), "mean": statistics.fmean(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_wall = make_chain(args.jobs, folder)
        figures = measure(args.jobs, args.store, folder)
    make_link = make_wall / args.jobs * 1000
    print(f"chain of {args.jobs} jobs ({'sqlite' if not args.store else args.store.split(':')[0]}), {os.cpu_count()} cpus")
    print(f"  reconciler: wall {figures['wall']:.2f}s, dependency-to-start per link p50 {figures['p50']:.2f} ms, "
          f"p99 {figures['p99']:.2f} ms, mean {figures['mean']:.2f} ms")
    print(f"  make -j2:   wall {make_wall:.2f}s, {make_link:.2f} ms per link (start + run of /bin/true)")
    print(f"  ratio wall reconciler/make: {figures['wall'] / make_wall:.1f}")


if __name__ == "__main__":
    main()
