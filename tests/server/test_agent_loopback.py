"""A node agent on loopback (no namespaces needed): what the agent does with what it is
given: a command that cannot start, a workingDir this machine lacks, a cancel while the run
lives, a run timeout, a stale report."""

from __future__ import annotations

import ipaddress
import os
import signal
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.helpers import wait_until
from tests.server.conftest import PREFIX, Server, free_port, job_manifest, settled


@pytest.fixture
def agent(serve, sqlite_url, tmp_path) -> Iterator[tuple[Server, subprocess.Popen]]:
    yield from _agent(serve, sqlite_url, tmp_path)


@pytest.fixture
def agent_on_either_store(serve, store_url, tmp_path) -> Iterator[tuple[Server, subprocess.Popen]]:
    """The agent's server over SQLite, then over PostgreSQL."""
    yield from _agent(serve, store_url, tmp_path)


@pytest.fixture
def sweeping_agent(serve, sqlite_url, tmp_path) -> Iterator[tuple[Server, subprocess.Popen]]:
    """An agent that looks for run folders to remove every 0.2 s, not every minute."""
    yield from _agent(serve, sqlite_url, tmp_path, {"RECONCILER_SWEEP_INTERVAL": "0.2"})


def _agent(serve, url: str, tmp_path, env: dict[str, str] | None = None) -> Iterator[tuple[Server, subprocess.Popen]]:
    server = serve(url, "--no-local-node")
    log = (tmp_path / "agent.log").open("w")
    argv = ["--server", server.url, "agent", "--node", "far", "--slots", "2", "--log-port", str(free_port())]
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", *argv, "--state-dir", str(tmp_path / "agent")],
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, "RECONCILER_HEARTBEAT_INTERVAL": "0.5", **(env or {})},
    )
    wait_until(lambda: server.http().get(f"{PREFIX}/nodes/far").status_code == 200, timeout=30, interval=0.1)
    yield server, proc
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)


def _apply(server: Server, *docs: dict) -> None:
    answer = server.http().post(f"{PREFIX}/apply", json={"items": list(docs)})
    assert answer.status_code == 200, answer.text


def test_a_command_that_cannot_start_on_the_agent_ends_start_failed(agent):
    server, _ = agent
    _apply(server, job_manifest("nothing", ["/no/such/program"]))
    status = settled(server, "nothing")["nothing"]["status"]
    (run,) = status["runs"]
    assert (run["outcome"], run["node"]) == ("StartFailed", "far")
    assert "/no/such/program" in status["message"]


def test_a_working_dir_the_node_lacks_is_replaced_by_the_runs_own_folder(agent, tmp_path):
    server, _ = agent
    _apply(server, job_manifest("where", ["pwd"], workingDir="/no/such/folder/on/this/node"))
    status = settled(server, "where")["where"]["status"]
    assert status["outcome"] == "Succeeded"
    (run,) = status["runs"]  # held as a local run is: in a cgroup of its own where one can be made
    assert run["limits"] in ("cgroup v1", "cgroup v2", "rlimit")
    assert run["limits"] == "rlimit" or "cpuSeconds" in run  # its cgroup's count, reported at its end
    printed = server.cli("logs", "job/where").stdout.strip()
    assert printed.startswith(str(tmp_path / "agent" / "runs" / "where."))
    # on the store alone, the logs are not there: it says where they are
    local = server.local("logs", "job/where")
    assert local.code == 1 and "ran on node far, whose agent keeps its logs" in local.stderr, local


def test_an_agent_without_a_token_serves_its_logs_on_loopback_only(agent, tmp_path):
    """Its log port has no authentication then: it listens on loopback (the server that
    fetches logs is on this machine: it listens on loopback too without tokens), its run
    records are private, and asking for another address is refused."""
    server, proc = agent
    listening = [
        c.laddr
        for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(ipaddress.ip_address(a.ip).is_loopback for a in listening), listening
    _apply(server, job_manifest("private", ["true"]))
    settled(server, "private")
    (record,) = (tmp_path / "agent" / "runs").glob("private.*/agent.json")
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    # nor may a web page read through it (a rebound DNS name sends its own Host)
    port = next(a.port for a in listening)
    rebound = httpx.get(f"http://127.0.0.1:{port}/logs/x", headers={"Host": "rebind.evil.example"}, timeout=10)
    assert rebound.status_code == 403 and "DNS rebinding" in rebound.text
    argv = ["--server", server.url, "agent", "--node", "open", "--log-host", "0.0.0.0"]
    refused = subprocess.run([sys.executable, "-m", "reconciler", *argv], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "--log-host 0.0.0.0: without a token" in refused.stderr and "loopback only" in refused.stderr


def test_a_server_stopping_answers_its_agents_long_polls_rather_than_cutting_them(agent):
    """An agent's long poll is answered when the server is asked to stop, so the server
    stops cleanly: uvicorn used to wait out its graceful shutdown for the poll, then cancel
    it with a traceback in the log."""
    server, _ = agent
    _apply(server, job_manifest("polled", ["true"]))
    settled(server, "polled")  # the agent is polling for its node's runs now
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn raises the signal again once stopped
    log = server.log.read_text()
    assert "CancelledError" not in log and "graceful shutdown exceeded" not in log, log


def test_the_agent_removes_the_run_folders_of_a_deleted_job_and_keeps_the_others(sweeping_agent, tmp_path):
    """As the controller's own agent does on its node: a deleted job's run folders (logs and
    all) go from the agent's state dir; a job that exists keeps its folders and its logs; a
    removal a crash interrupted (a folder renamed on its way out) is finished."""
    server, _ = sweeping_agent
    _apply(server, job_manifest("stays", ["echo", "still here"]), job_manifest("goes", ["true"]))
    jobs = settled(server, "stays", "goes")
    runs = tmp_path / "agent" / "runs"
    stays, goes = (runs / f"{name}.{jobs[name]['metadata']['uid']}.1" for name in ("stays", "goes"))
    assert (goes / "agent.json").exists() and (stays / "agent.json").exists()
    interrupted = runs / ".removing.old.0000.1"
    interrupted.mkdir()
    (interrupted / "stdout").write_text("left by an agent killed mid-removal")
    assert server.http().delete(f"{PREFIX}/jobs/goes").status_code == 200
    wait_until(lambda: not goes.exists() and not interrupted.exists(), timeout=30, interval=0.1)
    assert (stays / "agent.json").exists()
    assert server.cli("logs", "job/stays").stdout.strip() == "still here"


def test_cancel_and_run_timeout_stop_a_remote_run(agent):
    server, _ = agent
    _apply(
        server,
        job_manifest("held", ["sleep", "600"]),
        job_manifest("slow", ["sleep", "600"], runTimeout="1s", stopGracePeriod="1s"),
    )
    wait_until(lambda: server.job("held")["status"].get("phase") == "Running", timeout=30)
    pid = server.job("held")["status"]["runs"][0]["pid"]
    assert server.cli("cancel", "job/held").code == 0
    done = settled(server, "held", "slow")
    assert done["held"]["status"]["outcome"] == "Cancelled"
    assert done["held"]["status"]["runs"][0]["signal"] == signal.SIGTERM
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    slow = done["slow"]["status"]
    assert (slow["outcome"], slow["runs"][0]["outcome"], slow["runs"][0]["exitCode"]) == ("TimedOut", "TimedOut", -1)
    assert "job timed out" in server.cli("logs", "job/slow", "--stream", "stderr").stdout


def test_a_report_for_an_admission_that_is_not_current_is_refused_with_409(agent):
    server, _ = agent
    answer = server.http().post(f"{PREFIX}/nodes/far/runs/ghost/report", json={"uid": "u", "run": 1, "epoch": 3})
    assert answer.status_code == 409
    assert answer.json()["kind"] == "Status" and answer.json()["reason"] == "Conflict"


def test_a_report_whose_integer_does_not_fit_64_bits_is_refused_naming_the_field(agent):
    """A status is read back as a document of 64-bit integers (jsontext.parse): an agent's
    report with a larger one is refused (422), not stored to read back as a float."""
    server, _ = agent
    report = {"uid": "u", "run": 1, "epoch": 3, "exitCode": 2**64}
    answer = server.http().post(f"{PREFIX}/nodes/far/runs/ghost/report", json=report)
    assert answer.status_code == 422, answer.text
    assert "exitCode" in answer.text and "64 bits" in answer.text
    batch = {"items": [{"job": "ghost", "uid": "u", "run": 2**63, "epoch": 3}]}
    answer = server.http().post(f"{PREFIX}/nodes/far/runs/reports", json=batch)
    assert answer.status_code == 422 and "64 bits" in answer.text, answer.text


def test_reports_sent_together_are_kept_together_and_a_stale_one_is_refused_alone(agent_on_either_store):
    """POST nodes/NODE/runs/reports: several runs' reports in one request, kept in one
    transaction (on PostgreSQL pipelined); each is judged against its own admission, so a
    stale one is refused in its item (409) and does not take the current ones with it; so
    is one that names another job than its admission's (the controller steps the job a
    report names)."""
    from reconciler.store import Store
    from reconciler.store import scheduling as sched

    server, _ = agent_on_either_store
    _apply(server, job_manifest("long", ["sleep", "600"]), job_manifest("other", ["sleep", "600"]))
    wait_until(
        lambda: all(server.job(n)["status"].get("phase") == "Running" for n in ("long", "other")),
        timeout=30,
        message="both run on the agent",
    )
    store = Store(server.store)
    try:
        items = []
        for name in ("long", "other"):
            uid = server.job(name)["metadata"]["uid"]
            with store.read() as session:
                held = sched.admission(session, uid)
            assert held is not None and held.report is not None and held.epoch is not None
            items.append({"job": name, "uid": uid, "run": held.run_number, "epoch": held.epoch, **held.report})
            items[-1].update(ready=False, readyMessage=f"batched {name}")
        ghost = {"job": "ghost", "uid": "u", "run": 1, "epoch": 3}
        misnamed = {**items[0], "job": "other", "readyMessage": "misnamed"}  # long's admission
        answer = server.http().post(
            f"{PREFIX}/nodes/far/runs/reports", json={"items": [items[0], ghost, items[1], misnamed]}
        )
        assert answer.status_code == 200, answer.text
        codes = [(i["job"], i["code"]) for i in answer.json()["items"]]
        assert codes == [("long", 200), ("ghost", 409), ("other", 200), ("other", 409)]
        assert "no longer current" in answer.json()["items"][1]["message"]
        for name in ("long", "other"):
            with store.read() as session:
                held = sched.admission(session, server.job(name)["metadata"]["uid"])
            assert held is not None and held.report is not None
            assert held.report["readyMessage"] == f"batched {name}"  # kept, in the admission's report
    finally:
        store.dispose()
    assert server.cli("cancel", "job/long", "job/other").code == 0
    done = settled(server, "long", "other")
    assert {done[n]["status"]["outcome"] for n in ("long", "other")} == {"Cancelled"}


def test_an_agent_over_tls_with_its_token_runs_and_serves_logs(serve, sqlite_url, tmp_path):
    from tests.server.test_security import _self_signed

    cert, key = _self_signed(tmp_path)
    admin, token = "admin-" + "a" * 26, "agent-" + "b" * 26
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{admin} admin\n{token} agent secure\n")
    server = serve(
        sqlite_url,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--tokens",
        str(tokens),
        "--no-local-node",
        token=admin,
        scheme="https",
        verify=ssl.create_default_context(cafile=cert),
    )
    (tmp_path / "agent-token").write_text(token + "\n")
    argv = ["--server", server.url, "agent", "--node", "secure", "--token-file", str(tmp_path / "agent-token")]
    argv += ["--tls-ca", cert, "--log-port", str(free_port()), "--state-dir", str(tmp_path / "agent")]
    log = (tmp_path / "agent.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "reconciler", *argv], stdout=log, stderr=log, start_new_session=True)
    try:
        _apply(server, job_manifest("private", ["echo", "over tls"]))
        status = settled(server, "private")["private"]["status"]
        assert (status["outcome"], status["runs"][0]["node"]) == ("Succeeded", "secure")
        printed = server.cli("logs", "job/private", env={"SSL_CERT_FILE": cert})
        assert printed.stdout == "over tls\n", printed.stderr
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_remote_run_gets_its_artifact_fetched_and_unpacked_by_the_agent(agent, http_server, tmp_path):
    from tests.artifacts import Member, zip_bytes

    server, _ = agent
    data = zip_bytes(Member.script("run.sh", "#!/bin/sh\necho ran in $(pwd)\n"))
    url = http_server.put("/app.zip", data)
    bad = {"url": url, "sha256": "0" * 64}
    _apply(
        server,
        job_manifest("packed", ["./run.sh"], artifact={"url": url}),
        job_manifest("tampered", ["./run.sh"], artifact=bad),
    )
    done = settled(server, "packed", "tampered")
    assert done["packed"]["status"]["outcome"] == "Succeeded"
    printed = server.cli("logs", "job/packed").stdout
    assert printed.startswith(f"ran in {tmp_path / 'agent' / 'runs' / 'packed.'}") and printed.endswith("/work\n")
    tampered = done["tampered"]["status"]
    assert (tampered["outcome"], tampered["runs"][0]["outcome"], tampered["reason"]) == (
        "Failed",
        "StartFailed",
        "ArtifactInvalid",
    ), tampered


def test_an_agent_on_a_follower_server_of_postgresql_keeps_working_when_the_leader_dies(pg_url, serve, tmp_path):
    """Two servers on PostgreSQL, both --no-local-node; the agent talks to the follower: its
    reports reach the leader's controller through the store (the change feed and its
    notifications), and when the leader is killed the follower leads and records the end of
    the run the agent kept running."""
    import httpx

    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    leader = serve(pg_url, "--lease", "3s", "--no-local-node", env=env)
    follower = serve(pg_url, "--lease", "3s", "--no-local-node", env=env)
    assert httpx.get(f"{leader.url}/leader", timeout=5).json()["leader"]
    gate = tmp_path / "gate"
    argv = ["--server", follower.url, "agent", "--node", "far", "--log-port", "0", "--state-dir", str(tmp_path / "a")]
    log = (tmp_path / "agent.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", *argv],
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, "RECONCILER_HEARTBEAT_INTERVAL": "0.5"},
    )
    try:
        _apply(follower, job_manifest("first", ["true"]))
        assert settled(follower, "first")["first"]["status"]["runs"][0]["node"] == "far"
        _apply(follower, job_manifest("outlives", ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 4"]))
        wait_until(lambda: follower.job("outlives")["status"].get("phase") == "Running", timeout=30)
        os.kill(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait()
        gate.touch()
        done = settled(follower, "outlives")["outlives"]["status"]
        assert httpx.get(f"{follower.url}/leader", timeout=5).json()["leader"]
        (run,) = done["runs"]
        assert (run["exitCode"], run["node"]) == (4, "far")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_second_machine_claiming_a_served_node_is_refused_and_its_agent_exits(agent, tmp_path):
    """Another host (a UTS namespace with its own host name) starting an agent for a node an
    agent serves: its heartbeat is refused (409) and it exits 1 naming the node."""
    if os.geteuid() != 0:
        pytest.skip("a second host name needs unshare --uts (root)")
    server, _ = agent
    argv = ["--server", server.url, "agent", "--node", "far", "--log-port", "0", "--state-dir", str(tmp_path / "b")]
    script = 'hostname other-machine && exec "$@"'
    second = subprocess.run(
        ["unshare", "--uts", "sh", "-c", script, "sh", sys.executable, "-m", "reconciler", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1, second.stderr
    assert "node far is served by the agent" in second.stderr


def test_a_remote_run_past_its_memory_limit_ends_oom_killed_and_its_cgroup_goes(agent):
    from tests.resources.conftest import hierarchy, run_cgroup_dirs

    found = hierarchy()
    if found is None:
        pytest.skip("needs a cgroup hierarchy (the CI machine has v1)")
    server, _ = agent
    hog = f"{sys.executable} -c 'b = bytearray(300 * 1024 * 1024); b[::4096] = b\"x\" * len(b[::4096])'"
    _apply(server, {**job_manifest("hog", ["sh", "-c", hog]), "spec": {"shell": hog, "resources": {"memory": "64Mi"}}})
    status = settled(server, "hog")["hog"]["status"]
    (run,) = status["runs"]
    assert (status["outcome"], status["reason"], run["exitCode"]) == ("Failed", "OOMKilled", 137), status
    assert run["limits"] == f"cgroup {found.version}" and 0 < run["peakMemory"] <= 64 * 1024 * 1024
    assert not run_cgroup_dirs(found, server.job("hog")["metadata"]["uid"]), "the run's cgroup outlived it"
