"""Figure 10, `get jobs` through the HTTP API against straight from the store: the wall time
of `reconciler --server URL get jobs` beside `reconciler get jobs` on the same SQLite store of
N jobs, each a fresh interpreter, timed in interleaved rounds (median of each), plus the
list request alone (`GET /apis/reconciler.dev/v1alpha1/jobs`, from a warm client).

The server runs with --no-local-node, so its controller starts no run: the jobs stay Queued
and the store stays still while the figures are taken (the controller's first pass over
them is waited out before the rounds begin).

    .venv/bin/python bench/api.py --jobs 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cli import fill, timed
from bench.common import PYTHON, Row, log, scratch

LIST = "/apis/reconciler.dev/v1alpha1/jobs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(url: str, folder: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "reconciler", "--store", url, "serve", "--port", str(port), "--no-local-node"],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "serve.log").open("w"),
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def _quiet(url: str, server: str, proc: subprocess.Popen, still: float = 1.0, limit: float = 600.0) -> None:
    """Wait until the server answers and its store has not changed for `still` seconds (the
    controller's first pass over the jobs is done)."""
    import httpx

    from reconciler.store import Store

    store = Store(url)
    deadline = time.monotonic() + limit
    try:
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited {proc.returncode}")
            try:
                up = httpx.get(f"{server}/healthz", timeout=2).text == "ok"
            except httpx.HTTPError:
                up = False
            seq = store.change_seq()
            if seq != last:
                last, since = seq, time.monotonic()
            if up and time.monotonic() - since >= still:
                return
            time.sleep(0.1)
        raise RuntimeError("the server's store did not settle")
    finally:
        store.dispose()


def _list_request(server: str, rounds: int) -> float:
    """Median time of the list request alone, from a warm connection."""
    import httpx

    with httpx.Client(base_url=server, timeout=120) as client:
        client.get(LIST).raise_for_status()
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            client.get(LIST).raise_for_status()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure(jobs: int, rounds: int) -> dict[str, float]:
    reconciler = [PYTHON, "-m", "reconciler"]
    with scratch("sqlite") as (url, folder):
        log(f"api: {jobs} jobs stored; serve --no-local-node; {rounds} rounds")
        fill(url, jobs)
        proc, server = _serve(url, folder)
        try:
            _quiet(url, server, proc)
            env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
            commands = {
                "get jobs (store)": ([*reconciler, "--store", url, "get", "jobs"], env),
                "get jobs (API)": ([*reconciler, "--server", server, "get", "jobs"], env),
            }
            outputs = {
                name: subprocess.run(c, env=e, capture_output=True, text=True) for name, (c, e) in commands.items()
            }
            lines = {name: len(o.stdout.splitlines()) for name, o in outputs.items()}
            if len(set(lines.values())) != 1 or lines["get jobs (store)"] != jobs + 1:
                raise RuntimeError(f"the two listings differ: {lines}")
            samples: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(rounds):
                for name, (command, command_env) in commands.items():
                    samples[name].append(timed(command, command_env))
            figures = {name: statistics.median(values) for name, values in samples.items()}
            figures["GET list alone"] = _list_request(server, rounds)
            return figures
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def row(jobs: int, rounds: int) -> Row:
    figures = measure(jobs, rounds)
    api, store = figures["get jobs (API)"], figures["get jobs (store)"]
    return Row(
        "11 CLI get jobs through the API (sqlite)",
        f"--server {api:.3f} s on {jobs:,} jobs",
        f"--store {store:.3f} s",
        api / store,
        "x",
        None,
        [
            f"11 get jobs through the API (sqlite): median of {rounds} interleaved rounds, each a fresh "
            f"interpreter on {jobs:,} stored jobs: "
            + ", ".join(f"{name} {value:.3f} s" for name, value in figures.items())
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = row(args.jobs, args.rounds)
    print(result.reconciler, "|", result.reference, "|", result.result_text(), "|", *result.notes)


if __name__ == "__main__":
    main()
