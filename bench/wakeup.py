"""Figure 17, wake-ups on PostgreSQL: how long after a write by another process a `serve`
notices it, with LISTEN/NOTIFY (the default) against the poll alone (RECONCILER_LISTEN=off:
the 50 ms poll, as before notifications), in the same run.

A `reconciler serve` on a fresh PostgreSQL database (this machine its node); this process
applies N jobs (`/bin/true`) one at a time straight to the store, as another process would,
at random intervals of 40-120 ms (so a write falls anywhere in a poll's period), while a
watch stream from the server reads the events. Per job:
- change-to-watch-event: the ADDED event's arrival at the stream minus the end of the apply
  (its commit);
- apply-to-admission: the time of the job's `Admitted` event (stamped by the
  leader's controller in the admission's step) minus the end of the apply.
p50 and p99 of each, for both settings; the servers run one after the other on their own
databases.

    .venv/bin/python bench/wakeup.py [--jobs 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, Row, log, percentile, print_table, scratch

LIST = "/apis/reconciler.dev/v1alpha1/jobs"
HEAD = "apiVersion: reconciler.dev/v1alpha1\nkind: Job\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(url: str, folder: Path, listen: str) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    env = {**os.environ, "RECONCILER_LISTEN": listen, "XDG_STATE_HOME": str(folder / "xdg-state")}
    env.pop("RECONCILER_POLL_INTERVAL", None)
    proc = subprocess.Popen(
        [PYTHON, "-m", "reconciler", "--store", url, "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=(folder / f"serve-{listen}.log").open("w"),
        start_new_session=True,
        env=env,
    )
    server = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}: {(folder / f'serve-{listen}.log').read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server}/healthz", timeout=2).text == "ok":
                return proc, server
        time.sleep(0.05)
    raise RuntimeError("serve did not answer")


def _watch(server: str, since: str, arrived: dict[str, float], stop: threading.Event) -> None:
    import httpx

    params = {"watch": "true", "resourceVersion": since, "timeoutSeconds": "600"}
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.stream("GET", f"{server}{LIST}", params=params, timeout=httpx.Timeout(30, read=None)) as answer,
    ):
        for line in answer.iter_lines():
            if stop.is_set():
                return
            if line.strip():
                event = json.loads(line)
                if event["type"] == "ADDED":
                    arrived.setdefault(event["object"]["metadata"]["name"], time.time())


def _admitted_at(url: str, names: list[str]) -> dict[str, float]:
    """When each job was admitted: its `Admitted` event, stamped by the leader's controller
    in the admission's step."""
    from reconciler.store import Store
    from reconciler.store.dbapi import Statement

    store = Store(url)
    try:
        with store.read() as conn:
            rows = Statement("SELECT name, min(time) AS at FROM events WHERE reason = 'Admitted' GROUP BY name")
            found = {r.name: float(r.at) for r in rows.execute(conn)}
    finally:
        store.dispose()
    return {n: found[n] for n in names if n in found}


def measure(jobs: int, listen: str, seed: int) -> dict[str, list[float]]:
    import httpx

    from reconciler.apply import apply_manifests
    from reconciler.manifests import parse_text
    from reconciler.store import Store

    rand = random.Random(seed)
    with scratch("pg") as (url, folder):
        proc, server = _serve(url, folder, listen)
        store = Store(url)
        try:
            since = httpx.get(f"{server}{LIST}", timeout=30).json()["metadata"]["resourceVersion"]
            arrived: dict[str, float] = {}
            stop = threading.Event()
            threading.Thread(target=_watch, args=(server, since, arrived, stop), daemon=True).start()
            time.sleep(0.5)  # the stream is open (the history would replay a missed event anyway)
            written: dict[str, float] = {}
            for i in range(jobs):
                name = f"wake-{i}"
                text = f"{HEAD}metadata: {{name: {name}}}\nspec:\n  command: [/bin/true]\n"
                manifests, problems = parse_text(text, f"{name}.yaml", folder)
                if problems:
                    raise RuntimeError(problems)
                apply_manifests(store, manifests)
                written[name] = time.time()
                time.sleep(rand.uniform(0.04, 0.12))
            deadline = time.monotonic() + 60
            while len(arrived) < jobs and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            admitted: dict[str, float] = {}
            while time.monotonic() < deadline:
                admitted = _admitted_at(url, list(written))
                if len(admitted) == jobs:
                    break
                time.sleep(0.1)
            if len(arrived) < jobs or len(admitted) < jobs:
                raise RuntimeError(f"{len(arrived)} events and {len(admitted)} admissions of {jobs} jobs")
            return {
                "event": [(arrived[n] - written[n]) * 1000 for n in written],
                "admission": [(admitted[n] - written[n]) * 1000 for n in written],
            }
        finally:
            store.dispose()
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def row(jobs: int) -> Row:
    log(f"wakeup: {jobs} writes to a serve on PostgreSQL, with notifications, then with the poll alone")
    runs = {"notified": measure(jobs, "on", 1), "polled": measure(jobs, "off", 1)}
    f = {
        f"{run}.{what}.{q}": percentile(samples, q / 100)
        for run, by_what in runs.items()
        for what, samples in by_what.items()
        for q in (50, 99)
    }
    return Row(
        "17 wake-up after a write (postgresql)",
        f"watch event p50 {f['notified.event.50']:.1f} ms, admission p50 {f['notified.admission.50']:.1f} ms",
        f"poll alone: {f['polled.event.50']:.1f} ms, {f['polled.admission.50']:.1f} ms",
        f["notified.event.50"],
        "ms",
        None,
        [
            f"17 wake-ups (postgresql): {jobs} jobs applied one at a time by another process at random intervals "
            f"of 40-120 ms to a `serve` (this machine its node); change-to-watch-event (the ADDED event's arrival "
            f"minus the apply's end) with LISTEN/NOTIFY p50 {f['notified.event.50']:.1f} ms, p99 "
            f"{f['notified.event.99']:.1f} ms; poll alone (RECONCILER_LISTEN=off, 50 ms) p50 "
            f"{f['polled.event.50']:.1f} ms, p99 {f['polled.event.99']:.1f} ms. Apply-to-admission (the leader's "
            f"Admitted event time minus the apply's end): notified p50 {f['notified.admission.50']:.1f} ms, p99 "
            f"{f['notified.admission.99']:.1f} ms; poll alone p50 {f['polled.admission.50']:.1f} ms, p99 "
            f"{f['polled.admission.99']:.1f} ms"
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    print_table([row(args.jobs)], "wake-ups on PostgreSQL")


if __name__ == "__main__":
    main()
