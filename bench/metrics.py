"""Figure 12, a Prometheus scrape of a large store: the wall time of `GET /metrics` (an HTTP
request, as Prometheus makes it) against a store of 100,000 jobs, beside the same scrape of a
store of 1,000 jobs (the fixed cost: HTTP, the counters, the text format), in interleaved
rounds. The gauges are computed at scrape time from indexed columns, so the cost must not
follow the number of jobs much; aim (issue 14): under 100 ms at 100,000 jobs.

    .venv/bin/python bench/metrics.py --small 1000 --large 100000 --rounds 7
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, log, scratch

AIM_MS = 100.0
BATCH = 5000
# a store's jobs in the mix a busy one has: mostly done, some waiting in line
STATES = [
    ({"phase": "Completed", "outcome": "Succeeded", "reason": "Succeeded"}, 80),
    ({"phase": "Completed", "outcome": "Failed", "reason": "BackoffLimitExceeded"}, 8),
    ({"phase": "Running", "reason": "Started"}, 2),
    ({"phase": "Queued", "reason": "QueuedForSlots"}, 5),
    ({"phase": "Queued", "reason": "Unschedulable"}, 1),
    ({"phase": "Waiting", "reason": "WaitingForDependencies"}, 3),
    ({"phase": "Backoff", "reason": "BackoffScheduled"}, 1),
]
POOLS = ("batch", "gpu", "etl", None)


def fill(url: str, jobs: int) -> None:
    from reconciler.store import Store
    from reconciler.store import repository as repo

    cycle = [status for status, share in STATES for _ in range(share)]
    store = Store(url)
    try:
        for start in range(0, jobs, BATCH):
            with store.write() as tx:
                repo.create_many(
                    tx,
                    [
                        {
                            "kind": "Job",
                            "name": f"job-{i}",
                            "spec": {"command": ["/bin/true"], **({"pool": p} if (p := POOLS[i % 4]) else {})},
                            "labels": {},
                            "annotations": {},
                            "status": dict(cycle[i % len(cycle)]),
                        }
                        for i in range(start, min(jobs, start + BATCH))
                    ],
                )
            with store.write() as tx:
                for pool in POOLS[:3]:
                    if repo.get(tx.session, kind="Pool", name=pool) is None:
                        repo.create(tx, kind="Pool", name=pool, spec={"slots": 4}, labels={}, annotations={})
    finally:
        store.dispose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(small: int, large: int, rounds: int) -> dict[int, float]:
    import httpx

    from reconciler.metrics import serve_metrics
    from reconciler.store import Store

    with scratch("sqlite") as (small_url, _), scratch("sqlite") as (large_url, _):
        t0 = time.perf_counter()
        fill(small_url, small)
        fill(large_url, large)
        log(f"metrics: {small:,} and {large:,} jobs stored in {time.perf_counter() - t0:.1f} s")
        stores = {small: Store(small_url), large: Store(large_url)}
        servers = {size: serve_metrics(store, "127.0.0.1", free_port()) for size, store in stores.items()}
        ports = {size: server.server_port for size, server in servers.items()}
        samples: dict[int, list[float]] = {small: [], large: []}
        try:
            with httpx.Client() as client:
                for size in (small, large):  # warm: page cache, the first imports
                    client.get(f"http://127.0.0.1:{ports[size]}/metrics").raise_for_status()
                for _ in range(rounds):
                    for size in (small, large):
                        began = time.perf_counter()
                        answer = client.get(f"http://127.0.0.1:{ports[size]}/metrics")
                        samples[size].append(time.perf_counter() - began)
                        answer.raise_for_status()
                        if b"reconciler_jobs{" not in answer.content:
                            raise RuntimeError("the scrape has no reconciler_jobs")
        finally:
            for server in servers.values():
                server.shutdown()
            for store in stores.values():
                store.dispose()
    return {size: statistics.median(values) * 1000 for size, values in samples.items()}


def row(small: int, large: int, rounds: int, *, full: bool) -> Row:
    ms = measure(small, large, rounds)
    return Row(
        "12 metrics scrape of a large store (sqlite)",
        f"{ms[large]:.1f} ms at {large:,} jobs",
        f"{ms[small]:.1f} ms at {small:,} jobs",
        ms[large],
        "ms",
        AIM_MS if full else None,
        [
            f"12 metrics scrape (sqlite): GET /metrics over HTTP, median of {rounds} interleaved rounds: "
            f"{ms[small]:.1f} ms at {small:,} jobs, {ms[large]:.1f} ms at {large:,} "
            f"({ms[large] / ms[small]:.2f}x)"
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    result = row(args.small, args.large, args.rounds, full=True)
    print(result.reconciler, "|", result.reference, "|", result.result_text(), "|", *result.notes)


if __name__ == "__main__":
    main()
