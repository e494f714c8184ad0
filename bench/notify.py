"""Figure 10: notifier delivery, to a webhook receiver on loopback (tests/data/receiver.py, a
ThreadingHTTPServer in this process).

- throughput: M events put in the outbox at once (one transaction), then one lane (a
  Deliverer, as the controller runs it) delivers them all; events/s from the first to the
  last arrival. Reference: the same M bodies POSTed by a bare httpx client in a loop, with
  the same headers (the floor of one-at-a-time delivery to this receiver). Three rounds,
  each reference beside its lane; the medians.
- latency: N independent `/bin/true` jobs run by a controller in this process, with one
  notifier hearing every completion. Per event: its arrival at the receiver (time.time()
  when the body was read) minus the job's `completionTime` as stored (the same clock, the
  same machine). completionTime is stamped when the completing step began, before its
  write committed, so the figure holds the commit, waking the lane, its read of the outbox,
  the POST and the receiver's parsing; stored times have millisecond resolution (truncated),
  so each figure may be up to 1 ms high. Reference: one bare POST's round trip (p50).

    .venv/bin/python bench/notify.py [--events 2000] [--jobs 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, log, median, percentile, print_table, scratch
from tests.data.receiver import Receiver

AIM_MS = 100.0  # delivery latency p50


def _notifier(url: str) -> str:
    return f"apiVersion: reconciler.dev/v1alpha1\nkind: Notifier\nmetadata: {{name: hook}}\nspec:\n  url: {url}\n"


def _jobs(n: int) -> str:
    return "---\n".join(
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: job-{i}}}\nspec:\n  command: [/bin/true]\n"
        for i in range(n)
    )


def _apply(store, text: str, folder: Path) -> None:
    from reconciler.apply import apply_manifests
    from reconciler.manifests import parse_text

    manifests, problems = parse_text(text, "bench.yaml", folder)
    if problems:
        raise RuntimeError(problems)
    apply_manifests(store, manifests)


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.005)


def bare_posts(count: int) -> tuple[float, list[float]]:
    """(events/s, round trips in ms) of `count` POSTs by a bare httpx client, after a few to
    warm the connection; the rate from the first arrival to the last, as the lane's."""
    import httpx

    body = json.dumps({"event_id": "x" * 36, "name": "job-0", "time": "2026-01-01T00:00:00.000Z"}).encode()
    trips = []
    with Receiver() as receiver, httpx.Client(timeout=10) as client:
        for i in range(-5, count):
            t0 = time.perf_counter()
            headers = {"Content-Type": "application/json", "X-Reconciler-Event": f"bare-{i}"}
            client.post(f"{receiver.url}/ref", content=body, headers=headers).raise_for_status()
            trips.append((time.perf_counter() - t0) * 1000)
        arrivals = sorted(r.at for r in receiver.requests)[5:]
    return (count - 1) / (arrivals[-1] - arrivals[0]), trips[5:]


def throughput(events: int) -> float:
    """Events/s of one lane delivering `events` queued events."""
    from reconciler.clock import RealClock
    from reconciler.controller.notify import Deliverer
    from reconciler.store import Store, outbox

    with scratch("sqlite") as (url, folder), Receiver() as receiver:
        store = Store(url)
        _apply(store, _notifier(f"{receiver.url}/ok"), folder)
        now = time.time()
        with store.write() as tx:
            outbox.add(
                tx, (outbox.Pending("hook", f"e{i}", json.dumps({"event_id": f"e{i}"}), now) for i in range(events))
            )
        deliverer = Deliverer(store, clock=RealClock(), owner="bench:0:0").start()
        try:
            _wait(lambda: len(receiver.requests) >= events, max(60.0, events / 20), "throughput: not all delivered")
        finally:
            deliverer.stop()
            store.dispose()
        arrivals = sorted(r.at for r in receiver.requests)
        return (events - 1) / (arrivals[-1] - arrivals[0])


def latency(jobs: int) -> list[float]:
    """ms from each job's stored completionTime to its event's arrival."""
    from reconciler.api.meta import to_epoch
    from reconciler.controller.manager import Controller
    from reconciler.reads import job_statuses
    from reconciler.store import Store

    with scratch("sqlite") as (url, folder), Receiver() as receiver:
        store = Store(url)
        _apply(store, _notifier(f"{receiver.url}/ok") + "---\n" + _jobs(jobs), folder)
        controller = Controller(store).start()
        try:
            _wait(lambda: len(receiver.requests) >= jobs, max(60.0, jobs * 0.5), "latency: not all notified")
        finally:
            controller.stop()
        names = [f"job-{i}" for i in range(jobs)]
        completed = {n: to_epoch(s["completionTime"]) for n, s in job_statuses(store, names).items()}
        store.dispose()
        return [(r.at - completed[json.loads(r.body)["name"]]) * 1000 for r in receiver.requests]


def row(events: int, jobs: int, rounds: int = 3) -> Row:
    rates, bare_rates, trips = [], [], []
    for i in range(rounds):  # interleaved: this machine's speed drifts within a minute
        log(f"notify: round {i + 1} of {rounds}: {events} POSTs by a bare client, then by a lane")
        bare, round_trips = bare_posts(events)
        bare_rates.append(bare)
        trips += round_trips
        rates.append(throughput(events))
    rate, bare_rate = median(rates), median(bare_rates)
    log(f"notify: {jobs} jobs, each completion notified")
    lags = latency(jobs)
    p50, p99 = median(lags), percentile(lags, 0.99)
    label = "10 notifier delivery (sqlite)"
    note = (
        f"{label}: throughput = {events} events queued at once, one lane (POST, wait for the answer, next), "
        f"median of {rounds} rounds interleaved with the reference ({', '.join(f'{r:.0f}' for r in rates)}), "
        f"{rate:.0f} events/s against a bare httpx loop's {bare_rate:.0f}/s to the same receiver "
        f"({rate / bare_rate:.0%}; the lane also reads the outbox and writes each batch's results); latency = "
        f"arrival at the receiver - the job's stored completionTime, {jobs} /bin/true jobs on 2 slots: "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(lags):.1f} ms (stored times are truncated to ms: up to 1 ms "
        f"high); a bare POST's round trip p50 {median(trips):.2f} ms"
    )
    return Row(
        label,
        f"{rate:.0f} events/s; latency p50 {p50:.1f} ms, p99 {p99:.1f} ms",
        f"bare POST {bare_rate:.0f}/s, {median(trips):.2f} ms",
        p50,
        "ms",
        AIM_MS,
        [note],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=300)
    args = parser.parse_args(argv)
    print_table([row(args.events, args.jobs)])


if __name__ == "__main__":
    main()
