"""Several `reconciler serve` processes on one PostgreSQL (issue 13 part 5): one holds the
controller lease and runs the reconcile loop, the others answer the API and take over; a
paused former leader cannot write; followers are woken by LISTEN/NOTIFY, not the poll.

Real processes on a fresh database each: two servers on this machine share its node name
and state folder, as two servers of one host would, so the leader that takes over adopts
the runs of the one that died."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from reconciler.store import Store
from reconciler.store import lease as leases
from tests.crash.harness import marked, marker_runs
from tests.helpers import wait_until
from tests.server.conftest import PREFIX, Server

LEASE = "3s"
DAG = {  # job -> its dependencies: a diamond with a tail, wide enough to have runs alive at the kill
    "fetch": [],
    "left": ["fetch"],
    "right": ["fetch"],
    "middle": ["fetch"],
    "join": ["left", "right", "middle"],
    "report": ["join"],
}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "xdg"), **extra}


def leader_of(server: Server) -> dict:
    answer = httpx.get(f"{server.url}/leader", timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _leads(server: Server) -> dict | None:
    with contextlib.suppress(httpx.HTTPError):
        found = leader_of(server)
        return found if found["leader"] else None
    return None


def _apply(server: Server, tmp_path: Path, documents: list[dict]) -> None:
    path = tmp_path / f"manifests-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    result = server.cli("apply", "-f", str(path))
    assert result.code == 0, result.stdout + result.stderr


def _job(name: str, shell: str, deps: list[str]) -> dict:
    spec: dict = {"shell": shell}
    if deps:
        spec["dependsOn"] = deps
    return {"apiVersion": "reconciler.dev/v1alpha1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def _statuses(server: Server, names) -> dict[str, dict]:
    return {n: server.job(n).get("status", {}) for n in names}


def _all_completed(server: Server, names) -> dict[str, dict] | None:
    found = _statuses(server, names)
    return found if all(s.get("phase") == "Completed" for s in found.values()) else None


@pytest.mark.postgres
def test_one_server_leads_and_another_takes_over_after_kill_9_with_nothing_run_twice(pg_url, serve, tmp_path):
    env = _env(tmp_path)
    first = serve(pg_url, "--lease", LEASE, env=env)
    second = serve(pg_url, "--lease", LEASE, env=env)
    assert leader_of(first)["leader"] and leader_of(first)["term"] == 1
    follower = leader_of(second)
    assert not follower["leader"] and follower["holder"] == leader_of(first)["server"]
    assert "leading in term 1" in first.log.read_text()
    assert "following the leader" in second.log.read_text()

    markers = tmp_path / "markers"
    _apply(second, tmp_path, [_job(n, marked(markers, "sleep 1"), deps) for n, deps in DAG.items()])  # via a follower
    wait_until(
        lambda: any(s.get("phase") == "Running" for s in _statuses(second, ["left", "right", "middle"]).values()),
        timeout=60,
        message="the middle of the DAG is running",
    )
    os.kill(first.proc.pid, signal.SIGKILL)  # the leader only: its runs live on, in their own sessions
    first.proc.wait()

    took_over = wait_until(lambda: _leads(second), timeout=30, message="the other server leads")
    assert took_over["term"] == 2
    done = wait_until(lambda: _all_completed(second, DAG), timeout=120, interval=0.2, message="the DAG completed")
    for name, status in done.items():
        assert status["outcome"] == "Succeeded", (name, status)
        assert [r["number"] for r in status["runs"]] == [1], f"{name} ran {len(status['runs'])} times: {status}"
    runs = marker_runs(markers)  # what the processes themselves recorded: each job started once
    assert sorted(runs) == sorted(DAG)
    assert all(len(r) == 1 and r[0][2] is not None for r in runs.values()), runs


@pytest.mark.postgres
def test_a_paused_former_leader_cannot_write_after_it_resumes_and_steps_down(pg_url, serve, tmp_path):
    env = _env(tmp_path)
    first = serve(pg_url, "--lease", LEASE, env=env)
    second = serve(pg_url, "--lease", LEASE, env=env)
    first_owner = leader_of(first)["server"]
    node = wait_until(lambda: second.http().get(f"{PREFIX}/nodes").json()["items"], message="the node registered")
    node_name = node[0]["metadata"]["name"]

    def node_status() -> dict:
        return second.http().get(f"{PREFIX}/nodes/{node_name}").json()["status"]

    def agent_of_node() -> str:
        return node_status()["agent"]

    assert agent_of_node() == f"{first_owner}/term1"
    markers = tmp_path / "markers"
    # a run the first leader starts, which ends while it is paused: the next leader records it
    _apply(second, tmp_path, [_job("long", marked(markers, "sleep 4"), [])])
    wait_until(lambda: second.job("long")["status"].get("phase") == "Running", timeout=60, message="long runs")

    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        # the lease as the store holds it, read until it changes hands (the database's clock)
        store, last_expiry = Store(pg_url), None
        try:

            def taken() -> leases.Lease | None:
                nonlocal last_expiry
                with store.read() as conn:
                    found = leases.read(conn)
                assert found is not None
                if found.term == 1:
                    last_expiry = found.expires_at  # a renewal in flight at the pause may still land
                    return None
                return found

            new = wait_until(taken, timeout=30, interval=0.05, message="the lease changed hands")
        finally:
            store.dispose()
        assert new.term == 2 and last_expiry is not None
        # never before the paused leader's lease ran out, and within one lease period of it
        assert last_expiry <= new.acquired_at < last_expiry + 3.0, (last_expiry, new.acquired_at)
        took_over = wait_until(lambda: _leads(second), timeout=30, message="the other server leads")
        assert took_over["term"] == 2
        wait_until(lambda: agent_of_node().endswith("/term2"), timeout=30, message="the new leader's heartbeat")
        beat = node_status()["heartbeatAt"]
        _apply(second, tmp_path, [_job("during", marked(markers, "true"), [])])
        wait_until(lambda: _all_completed(second, ["during"]), timeout=60, message="the job applied meanwhile ran")
        # the new leader's next heartbeat (10 s on): the paused one's is overdue, so its change
        # watcher's first act on resuming is a heartbeat write
        wait_until(lambda: node_status()["heartbeatAt"] != beat, timeout=30, message="the next heartbeat")
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)

    wait_until(lambda: "stepping down from term 1" in first.log.read_text(), timeout=30, message="it stepped down")
    assert not leader_of(first)["leader"]
    assert leader_of(second)["leader"] and leader_of(second)["term"] == 2
    # no write of the former leader landed: the node still names the leader of term 2
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert agent_of_node().endswith("/term2"), agent_of_node()
        time.sleep(0.1)
    done = wait_until(lambda: _all_completed(second, ["during", "long"]), timeout=60, message="both completed")
    for name, status in done.items():
        assert status["outcome"] == "Succeeded", status
        assert [r["number"] for r in status["runs"]] == [1], status
        assert [r[0] for r in marker_runs(markers)[name]] == [1]
    # it serves the API as a follower: a write through it lands, and the leader runs it
    _apply(first, tmp_path, [_job("after", "true", [])])
    wait_until(lambda: _all_completed(second, ["after"]), timeout=60, message="a job applied through the follower ran")


@pytest.mark.postgres
def test_a_stopped_leader_releases_the_lease_and_the_other_leads_at_once(pg_url, serve, tmp_path):
    env = _env(tmp_path)
    first = serve(pg_url, "--lease", "60s", env=env)
    second = serve(pg_url, "--lease", "60s", env=env)
    first.proc.send_signal(signal.SIGTERM)
    first.proc.wait(timeout=30)
    # a minute's lease: taken within seconds only because it was released
    took_over = wait_until(lambda: _leads(second), timeout=20, message="the other server leads")
    assert took_over["term"] == 2


class _Events:
    """A watch stream read in a thread, each event with when it arrived."""

    def __init__(self, url: str, params: dict):
        self.arrived: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(url, params), daemon=True).start()

    def _read(self, url: str, params: dict) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream("GET", url, params=params, timeout=httpx.Timeout(30, read=None)) as answer,
        ):
            for line in answer.iter_lines():
                if line.strip():
                    self.arrived.put((time.monotonic(), json.loads(line)))


@pytest.mark.postgres
def test_notifications_wake_the_watch_streams_and_the_controller_before_the_poll(pg_url, serve, tmp_path):
    """With the poll set to a minute (RECONCILER_POLL_INTERVAL), a write by another process
    reaches a watch stream of a follower, and the leader's controller, within seconds:
    only PostgreSQL's notifications can have told them (the controller's heartbeat does not
    read the change feed; nothing else of the leader looks at a job it has not seen)."""
    env = _env(tmp_path, RECONCILER_POLL_INTERVAL="60")
    started = time.monotonic()
    leader = serve(pg_url, "--lease", LEASE, env=env)
    follower = serve(pg_url, "--lease", LEASE, env=env)
    listing = follower.http().get(f"{PREFIX}/jobs").json()
    events = _Events(
        f"{follower.url}{PREFIX}/jobs",
        {
            "watch": "true",
            "resourceVersion": listing["metadata"]["resourceVersion"],
            "timeoutSeconds": 50,
            "allowWatchBookmarks": "true",
        },
    )
    # the stream's first bookmark comes once it follows the store: the write below is then
    # one it must be woken for (one made before would be replayed from the history)
    assert events.arrived.get(timeout=20)[1]["type"] == "BOOKMARK"

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job("woken", "true", [])))
    written = time.monotonic()
    result = follower.local("apply", "-f", str(path))  # straight on the store: another process's write
    assert result.code == 0, result.stdout + result.stderr
    at, event = events.arrived.get(timeout=20)
    while event["type"] == "BOOKMARK":
        at, event = events.arrived.get(timeout=20)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "woken")
    assert at - written < 20  # a minute's poll could not have brought it
    # the leader's change watcher was woken too: the job ran long before its first poll
    status = wait_until(lambda: _all_completed(leader, ["woken"]), timeout=20, message="the job ran")
    assert status["woken"]["outcome"] == "Succeeded"
    assert time.monotonic() - started < 50, "the minute's poll could have run it"


def test_a_lone_server_on_sqlite_leads_and_says_so(serve, sqlite_url):
    server = serve(sqlite_url)
    found = leader_of(server)
    assert found["leader"] and found["term"] == 1 and found["holder"] == found["server"]
    assert found["leaseSeconds"] == 15


def test_a_bad_lease_or_poll_interval_is_refused(sqlite_url, tmp_path):
    from tests.helpers import run_cli

    result = run_cli("serve", "--lease", "0.5s", store=sqlite_url, timeout=30)
    assert result.code == 2 and "--lease 0.5s: at least 1s" in (result.stdout + result.stderr)
    result = run_cli("serve", "--lease", "soon", store=sqlite_url, timeout=30)
    assert result.code == 2 and "--lease" in (result.stdout + result.stderr)
    result = run_cli("serve", store=sqlite_url, timeout=30, env={"RECONCILER_POLL_INTERVAL": "never"})
    assert result.code == 2 and "RECONCILER_POLL_INTERVAL='never'" in (result.stdout + result.stderr)


def test_a_bad_listen_setting_is_refused_when_a_postgresql_store_opens(pg_url):
    from tests.helpers import run_cli

    result = run_cli("get", "jobs", store=pg_url, timeout=30, env={"RECONCILER_LISTEN": "maybe"})
    assert result.code == 2 and "RECONCILER_LISTEN='maybe': give on (the default) or off" in result.stderr


@pytest.mark.postgres
def test_a_server_beside_a_live_one_that_could_not_adopt_its_runs_is_refused(pg_url, serve, tmp_path):
    """Servers on one machine share its node, and a new leader adopts the runs of the one
    before from their shared state folder: a server with another folder (it would record them
    Lost and run them again), or without the local node (it could not act on them at all),
    is refused at its start while the first one lives (exit 2, naming the folders)."""
    env = _env(tmp_path)
    first = serve(pg_url, "--lease", LEASE, env=env)
    wait_until(lambda: leader_of(first)["leader"], timeout=30, message="the first server leads")
    elsewhere = _env(tmp_path / "elsewhere")

    def started(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "reconciler", "--store", pg_url, "serve", "--port", "0", *args]
        return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)

    other_folder = started("--lease", LEASE, env=elsewhere)
    assert other_folder.returncode == 2, other_folder
    assert "state folder" in other_folder.stderr and str(tmp_path / "elsewhere") in other_folder.stderr
    no_node = started("--lease", LEASE, "--no-local-node", env=env)
    assert no_node.returncode == 2 and "without the local node" in no_node.stderr, no_node
    second = serve(pg_url, "--lease", LEASE, env=env)  # the same folder: a follower, as before
    assert not leader_of(second)["leader"]


def test_a_server_dead_of_kill_9_does_not_hold_back_the_next_one(serve, sqlite_url, tmp_path):
    """Its node's heartbeat is still fresh, but its process is proven gone (its owner names
    the term it led in after the process): a server without the local node may start."""
    first = serve(sqlite_url, "--lease", LEASE)
    wait_until(lambda: leader_of(first)["leader"], timeout=30, message="the first server leads")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=30)
    second = serve(sqlite_url, "--lease", LEASE, "--no-local-node")
    wait_until(lambda: leader_of(second)["leader"], timeout=30, message="the second server leads")
