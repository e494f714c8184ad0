"""The benchmark suite at its CI size keeps working: `bench/run.py --small` completes and prints
a row for every figure. Benchmarks are never tests of speed: nothing here looks at a time."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURES = [
    "1 DAG throughput (sqlite)",
    "2 dependency latency (sqlite)",
    "3 admission at depth, no room (sqlite)",
    "3 admission at depth, head blocks (sqlite)",
    "4 apply, first (sqlite)",
    "4 apply, unchanged again (sqlite)",
    "5 idle cost (sqlite)",
    "6 memory (sqlite)",
    "8 CLI get job NAME (sqlite)",
    "9 apply one job into a large store (sqlite)",
    "10 notifier delivery (sqlite)",
    "11 CLI get jobs through the API (sqlite)",
    "12 metrics scrape of a large store (sqlite)",
    "13 chain per link (sqlite)",
    "14 dashboard pages (sqlite)",
    "15 ingestion from RabbitMQ (sqlite)",
    "16 run start with a cgroup",
    "19 run start, C fork server against the exec'd C wrapper",
    "18 remote agents, throughput (sqlite)",
    "18 remote agents, placement to start (sqlite)",
    "18 remote agents, chain per link (sqlite)",
]
PG_FIGURES = [
    "7 DAG throughput (postgresql)",
    "7 admission at depth, no room (postgresql)",
    "7 admission at depth, head blocks (postgresql)",
    "13 chain per link (postgresql)",
    "17 wake-up after a write (postgresql)",
    "20 burn-down over agents (postgresql)",
]


def _pg_answers() -> bool:
    sys.path.insert(0, str(ROOT))
    try:
        from bench.common import pg_available

        return pg_available()
    finally:
        sys.path.remove(str(ROOT))


@pytest.mark.skipif(shutil.which("make") is None, reason="the references run make")
@pytest.mark.timeout(240)
def test_suite_runs_at_ci_size():
    pg = _pg_answers()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--small", "--pg" if pg else "--no-pg"],
        capture_output=True,
        text=True,
        timeout=230,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = proc.stdout
    assert "nproc" in out and "python" in out and "CPU" in out and "date" in out
    for figure in FIGURES + (PG_FIGURES if pg else []):
        line = next((ln for ln in out.splitlines() if ln.startswith(figure + " ")), None)
        assert line is not None, f"no row for {figure!r} in:\n{out}"
        cells = [c.strip() for c in line.split("|")]
        assert len(cells) == 6 and cells[1] != "FAILED", line
        assert re.search(r"\d", cells[3]), line  # a measured figure, whatever its value
