"""Concurrent read-modify-write from several OS processes on the same objects, on SQLite and
PostgreSQL: optimistic concurrency on resourceVersion must lose no update.

Each worker process repeatedly reads a Job, increments a counter label and writes it back
carrying the resourceVersion it read, either through the real CLI (`apply -f -` with
`metadata.resourceVersion`, exit 4 on a stale one) or through `repository.update_object`
(raises Conflict); on a conflict it reads again and retries. Every successful write reports
the counter it wrote, the resourceVersion it read and the one it produced, so the test can
check the whole history: the written counters are exactly 1..N (no lost or doubled update),
each write was based on the immediately preceding one (so every stale write was refused),
every refusal concerned a read that really was stale, and the final object carries the last
write's resourceVersion."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import run_cli

API = "reconciler.dev/v1alpha1"
SPEC = {"command": ["true"], "workingDir": "/"}  # absolute: the spec is the same from any cwd
WORKER_DEADLINE = 240.0  # seconds; a worker that cannot finish by then fails the test, never hangs it


def manifest(name: str, counter: int, rv: str | None = None) -> str:
    metadata: dict[str, Any] = {"name": name, "labels": {"counter": str(counter)}}
    if rv is not None:
        metadata["resourceVersion"] = rv
    return yaml.safe_dump({"apiVersion": API, "kind": "Job", "metadata": metadata, "spec": SPEC})


# --------------------------------------------------------------------------- the worker (a separate process)


def _worker(url: str, name: str, writes: int, via: str, gate: Any, results: Any) -> None:
    """Make `writes` successful increments of job `name`'s counter; report every attempt."""
    from reconciler.errors import Conflict
    from reconciler.store import Store, eventlog
    from reconciler.store import repository as repo

    store = Store(url)
    env = {**os.environ, "RECONCILER_STORE": url}
    report: dict[str, Any] = {"name": name, "via": via, "ok": [], "refused": 0, "false_refusals": [], "errors": []}

    def read():
        with store.read() as conn:
            obj = repo.get(conn, kind="Job", name=name)
        assert obj is not None
        return obj

    try:
        gate.wait(timeout=WORKER_DEADLINE)  # everyone starts together: maximal contention
        deadline = time.monotonic() + WORKER_DEADLINE
        done = 0
        while done < writes:
            if time.monotonic() > deadline:
                report["errors"].append("deadline passed")
                break
            current = read()
            counter = int(current.labels["counter"]) + 1
            read_rv = current.resource_version
            if via == "cli":
                proc = subprocess.run(
                    [sys.executable, "-m", "reconciler", "apply", "-f", "-", "-o", "json"],
                    input=manifest(name, counter, str(read_rv)),
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=WORKER_DEADLINE,
                )
                if proc.returncode == 0:
                    item = json.loads(proc.stdout)  # one object: printed as itself
                    new_rv = int(item["metadata"]["resourceVersion"])
                    written = int(item["metadata"]["labels"]["counter"])
                elif proc.returncode == 4:
                    if "stale" not in proc.stderr or str(read_rv) not in proc.stderr:
                        report["errors"].append(f"exit 4 without a clear message: {proc.stderr!r}")
                    new_rv = None
                else:
                    report["errors"].append(f"exit {proc.returncode}: {proc.stderr[-500:]}")
                    break
            else:
                try:
                    with store.write() as tx:
                        obj = repo.update_object(tx, current, labels={**current.labels, "counter": str(counter)})
                        eventlog.record(tx, eventlog.ObjectEvent(obj, "Configured", f"counter {counter}"))
                    new_rv, written = obj.resource_version, counter
                except Conflict:
                    new_rv = None
            if new_rv is None:
                report["refused"] += 1
                if read().resource_version == read_rv:  # a refusal must concern a read that really is stale
                    report["false_refusals"].append(read_rv)
                continue
            report["ok"].append({"counter": written, "read_rv": read_rv, "new_rv": new_rv})
            done += 1
    except BaseException as exc:
        report["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        store.dispose()
        results.put(report)


# --------------------------------------------------------------------------- the parent


def run_workers(url: str, plan: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
    """Start one process per (job name, writes, via) and collect their reports."""
    ctx = multiprocessing.get_context("spawn")
    gate = ctx.Barrier(len(plan))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, name, writes, via, gate, results), daemon=True)
        for name, writes, via in plan
    ]
    for p in procs:
        p.start()
    reports: list[dict[str, Any]] = []
    deadline = time.monotonic() + WORKER_DEADLINE + 60
    try:
        while len(reports) < len(procs):
            try:
                reports.append(results.get(timeout=0.2))
                continue
            except queue.Empty:
                pass
            crashed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if crashed or all(not p.is_alive() for p in procs):
                while True:  # a worker that finished may have left its report behind it
                    try:
                        reports.append(results.get(timeout=1))
                    except queue.Empty:
                        break
                if len(reports) < len(procs):
                    pytest.fail(f"worker processes ended without reporting (exit codes {[p.exitcode for p in procs]})")
            if time.monotonic() > deadline:
                pytest.fail(f"workers did not finish within {WORKER_DEADLINE + 60:.0f}s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return reports


def check_history(url: str, name: str, reports: list[dict[str, Any]], initial_rv: int) -> int:
    """Everything the reports say about job `name` is consistent; returns its final resourceVersion."""
    from reconciler.store import Store
    from reconciler.store import repository as repo

    mine = [r for r in reports if r["name"] == name]
    successes = sorted((w for r in mine for w in r["ok"]), key=lambda w: w["counter"])
    store = Store(url)
    try:
        with store.read() as conn:
            final = repo.get(conn, kind="Job", name=name)
    finally:
        store.dispose()
    assert final is not None
    n = len(successes)
    # no lost update: the counter counts every successful write, and each counter value was written once
    assert int(final.labels["counter"]) == n
    assert [w["counter"] for w in successes] == list(range(1, n + 1))
    # each success was based on the one before it: a write from a stale read never got through
    previous = initial_rv
    for w in successes:
        assert w["read_rv"] == previous, f"write of counter {w['counter']} was based on a stale read"
        assert w["new_rv"] > previous
        previous = w["new_rv"]
    # the final resourceVersion is the last write's
    assert final.resource_version == previous
    return final.resource_version


def _create_jobs(url: str, names: list[str]) -> dict[str, int]:
    from pathlib import Path

    from reconciler.apply import apply_manifests
    from reconciler.manifests import parse_text
    from reconciler.store import Store

    manifests, problems = parse_text("---\n".join(manifest(n, 0) for n in names), "<test>", Path("/"))
    assert not problems
    store = Store(url)
    try:
        changes = apply_manifests(store, manifests)
        assert [c.action for c in changes] == ["created"] * len(names)
        return {c.name: int(c.after["metadata"]["resourceVersion"]) for c in changes}
    finally:
        store.dispose()


# (via, successful writes) per worker process; through the CLI every attempt starts an
# interpreter (~0.5 s), so CLI writes are kept few and the repository workers do the volume
workers = st.lists(
    st.one_of(
        st.tuples(st.just("cli"), st.integers(min_value=1, max_value=2)),
        st.tuples(st.just("repo"), st.integers(min_value=1, max_value=4)),
    ),
    min_size=2,
    max_size=3,
).filter(lambda ws: sum(writes for via, writes in ws if via == "cli") <= 3)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=workers, n_jobs=st.integers(min_value=1, max_value=2), data=st.data())
def test_concurrent_read_modify_write_loses_no_update(store_url, plan, n_jobs, data):
    """One store per test (both back ends); each example works on jobs of its own."""
    tag = uuid.uuid4().hex[:8]
    names = [f"counter-{tag}-{i}" for i in range(n_jobs)]
    initial = _create_jobs(store_url, names)
    assignment = [(names[data.draw(st.integers(0, n_jobs - 1), label="job")], writes, via) for via, writes in plan]

    reports = run_workers(store_url, assignment)

    assert len(reports) == len(assignment)
    for r in reports:
        assert r["errors"] == [], r
        assert r["false_refusals"] == [], f"a write was refused although its resourceVersion was current: {r}"
    wanted = {n: sum(w for m, w, _ in assignment if m == n) for n in names}
    finals = []
    for name in names:  # every worker got all its writes through eventually
        got = sum(len(r["ok"]) for r in reports if r["name"] == name)
        assert got == wanted[name]
        finals.append(check_history(store_url, name, reports, initial[name]))
    # the change sequence: refused writes took no resourceVersion; the last write holds the newest
    from reconciler.store import Store

    store = Store(store_url)
    try:
        assert store.change_seq() == max(finals)
    finally:
        store.dispose()


def test_two_writers_with_the_same_resource_version_first_wins(store_url):
    """Both read the same rv; the first write wins, the second gets exit 4 and a message."""
    created = run_cli("apply", "-f", "-", store=store_url, input=manifest("shared", 0))
    assert created.code == 0, created.stderr
    got = run_cli("get", "job", "shared", "-o", "json", store=store_url)
    assert got.code == 0, got.stderr
    rv = json.loads(got.stdout)["metadata"]["resourceVersion"]

    first = run_cli("apply", "-f", "-", store=store_url, input=manifest("shared", 1, rv))
    assert first.code == 0, first.stderr
    assert first.stdout.strip() == "job.reconciler.dev/shared configured"

    second = run_cli("apply", "-f", "-", store=store_url, input=manifest("shared", 2, rv))
    assert second.code == 4, (second.code, second.stdout, second.stderr)
    assert second.stdout == ""
    assert "resourceVersion" in second.stderr and f"{rv} is stale" in second.stderr
    assert "Traceback" not in second.stderr

    after = json.loads(run_cli("get", "job", "shared", "-o", "json", store=store_url).stdout)
    assert after["metadata"]["labels"]["counter"] == "1"
    assert int(after["metadata"]["resourceVersion"]) > int(rv)


def test_a_stale_update_object_from_another_process_is_refused(store_url):
    """The repository path: two processes hold the same StoredObject; only one update lands."""
    initial = _create_jobs(store_url, ["pair"])
    reports = run_workers(store_url, [("pair", 2, "repo"), ("pair", 2, "repo")])
    for r in reports:
        assert r["errors"] == [] and r["false_refusals"] == [], r
    assert check_history(store_url, "pair", reports, initial["pair"]) > initial["pair"]
