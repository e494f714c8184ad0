"""Figure 20, a burn-down on PostgreSQL: N no-op jobs (`/bin/true`, no dependencies) applied at
once and run to the last completion over three `reconciler agent`s, each in its own network
namespace joined to this one by a veth pair (three machines on one), with `serve
--no-local-node` here on a fresh PostgreSQL database (created per run, dropped after);
beside the same jobs on the embedded controller (`serve` with this machine as its node, the
same total slots) on another fresh database.

Timed from outside: from the return of `reconciler apply` to the moment a poll of the store
(every 50 ms) counts every job Completed; jobs/s = N / that time. The notes give PostgreSQL's
own counters over the burn-down (pg_stat_database: commits and rows written per job).

Slots: 8 per agent (24 in all). A run of /bin/true lasts a few ms, so the slots are only
how many placed runs an agent holds at once: enough that every admission pass and every
batch of reports carries many runs, while an admission pass (which looks at every queued
job it may admit) stays short; the two cores, not the slots, bound the figure.

    .venv/bin/python bench/burndown.py --jobs 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agents import AGENTS, Cluster, _apply, _manifests, local_serve
from bench.common import Row, child_env, log, scratch

SLOTS = 8  # per agent; the embedded reference gets AGENTS * SLOTS
AIM = 1000.0  # jobs/s (issue 15)
POLL = 0.05


def _counters(url: str) -> tuple[int, int]:
    """(commits, rows inserted + updated + deleted) of this database so far."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _burn(url: str, folder: Path, jobs: int, side: str, env: dict[str, str]) -> dict[str, float]:
    """Apply the jobs; seconds until all are Completed (and all Succeeded), and the counters."""
    from reconciler.store import Store
    from reconciler.store.dbapi import Statement

    path = _manifests(folder, jobs, ("/bin/true",), "b")
    applied = _apply(url, path, env)
    t0 = time.monotonic()
    before = _counters(url)
    count = Statement("SELECT count(*) FROM objects WHERE kind = 'Job' AND phase = 'Completed'")
    store = Store(url)
    try:
        while True:
            with store.read() as conn:
                if int(count.execute(conn).scalar()) >= jobs:
                    break
            if time.monotonic() - t0 > max(600.0, jobs / 2):
                raise RuntimeError(f"{side}: {jobs} jobs did not complete in time")
            time.sleep(POLL)
        took = time.monotonic() - t0
        with store.read() as conn:
            rows = Statement("SELECT status FROM objects WHERE kind = 'Job'").execute(conn).all()
        succeeded = sum(json.loads(r.status or "{}").get("outcome") == "Succeeded" for r in rows)
    finally:
        store.dispose()
    if succeeded != jobs:
        raise RuntimeError(f"{side}: {succeeded} of {jobs} jobs succeeded")
    time.sleep(1.0)  # backends publish their statistics when idle for a moment
    after = _counters(url)
    return {
        "took": took,
        "apply": applied,
        "commits": (after[0] - before[0]) / jobs,
        "rows": (after[1] - before[1]) / jobs,
    }


def embedded(jobs: int, slots: int) -> dict[str, float]:
    """The reference: `serve` with this machine as its node, AGENTS * slots slots."""
    with scratch("pg", "reconciler-bench-burndown-") as (url, folder):
        env = child_env(url, folder)
        with local_serve(url, folder, AGENTS * slots, env):
            return _burn(url, folder, jobs, "embedded", env)


def remote(jobs: int, slots: int) -> tuple[dict[str, float], bool]:
    with scratch("pg", "reconciler-bench-burndown-") as (url, folder):
        cluster = Cluster(url, folder, slots=slots, host_server=True)
        try:
            cluster.start()
            return _burn(url, folder, jobs, "agents", child_env(url, folder)), cluster.isolated
        finally:
            cluster.close()


def row(jobs: int, slots: int = SLOTS) -> Row:
    log(f"burndown: {jobs} jobs of /bin/true on the embedded controller ({AGENTS * slots} slots, postgresql)")
    base = embedded(jobs, slots)
    log(f"burndown: the same over {AGENTS} agents of {slots} slots (postgresql)")
    got, isolated = remote(jobs, slots)
    where = "3 network namespaces" if isolated else "loopback (no network namespaces here)"
    rate, ref = jobs / got["took"], jobs / base["took"]
    return Row(
        "20 burn-down over agents (postgresql)",
        f"{rate:.0f} jobs/s ({1000 / rate:.2f} ms a job): {jobs:,} jobs over {AGENTS} agents x {slots} slots "
        f"({where}), {got['took']:.1f} s",
        f"embedded controller, {AGENTS * slots} slots: {ref:.0f} jobs/s, {base['took']:.1f} s",
        1000 / rate,
        "ms",
        1000 / AIM,  # the aim, 1,000 jobs/s, as time per job
        [
            f"20: agents {rate:.0f} jobs/s (aim >= {AIM:.0f}), {100 * rate / ref:.0f}% of the embedded controller's "
            f"{ref:.0f} jobs/s; per job on PostgreSQL: agents {got['commits']:.1f} commits, {got['rows']:.1f} rows "
            f"written; embedded {base['commits']:.1f} commits, {base['rows']:.1f} rows (pg_stat_database); "
            f"apply of the {jobs:,} jobs took {got['apply']:.1f} s / {base['apply']:.1f} s (not timed)"
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=SLOTS, help="per agent")
    args = parser.parse_args()
    print(row(args.jobs, args.slots))


if __name__ == "__main__":
    main()
