"""A node agent on loopback, where the server must not lose track of a run's fate: a stop of a
run its agent may have started (its start report delayed, the agent silent), a server
restart longer than `retry.lostAfter`, a duplicate or replaced agent, the next run of a job
whose stale run is still ending, a token the server refuses, an answer that comes after the
agent's lease ran out, and an older server. A silent agent is a stopped process (SIGSTOP):
its connections stay open, as a partition's do."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import httpx
import psutil
import pytest

from reconciler.api.meta import to_epoch
from reconciler.nodeagent.daemon import NodeAgent, Options
from tests.helpers import wait_until
from tests.server.conftest import PREFIX, Server, job_manifest, settled


def _alive(pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def _pid_of(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _recording(pidfile: Path, seconds: int = 600) -> list[str]:
    """A run that writes its pid (the shell's, which execs sleep) where the test reads it."""
    return ["sh", "-c", f"echo $$ > {pidfile}; exec sleep {seconds}"]


@pytest.fixture
def agents(tmp_path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start `reconciler agent` processes (for a server); each is killed after the test."""
    started: list[subprocess.Popen] = []

    def start(server: Server, name: str, *, env: dict | None = None, wrap: list | None = None, extra: list = ()):
        log = (tmp_path / f"{name}.log").open("w")
        argv = ["--server", server.url, "agent", "--node", "far", "--slots", "2", "--log-port", "0", *extra]
        argv += ["--state-dir", str(tmp_path / name)]
        proc = subprocess.Popen(
            [*(wrap or []), sys.executable, "-m", "reconciler", *argv],
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "RECONCILER_HEARTBEAT_INTERVAL": "0.5", **(env or {})},
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


def _node_up(server: Server, node: str = "far") -> None:
    wait_until(lambda: server.http().get(f"{PREFIX}/nodes/{node}").status_code == 200, timeout=30, interval=0.1)


def _apply(server: Server, *docs: dict) -> None:
    answer = server.http().post(f"{PREFIX}/apply", json={"items": list(docs)})
    assert answer.status_code == 200, answer.text


def _phase(server: Server, name: str) -> str | None:
    return server.job(name).get("status", {}).get("phase")


def test_a_cancel_of_a_run_whose_start_is_not_reported_yet_waits_for_the_agent(serve, sqlite_url, agents, tmp_path):
    """The agent started the run and holds its start report back (RECONCILER_START_REPORT_DELAY):
    the job is Starting as far as the server knows. A cancel must not free the slots while
    the process may live: the agent stops it, and the job is Cancelled once it is gone."""
    server = serve(sqlite_url, "--no-local-node")
    agents(server, "agent", env={"RECONCILER_START_REPORT_DELAY": "120"})
    _node_up(server)
    pidfile = tmp_path / "c4.pid"
    _apply(server, job_manifest("c4", _recording(pidfile), stopGracePeriod="2s"))
    pid = wait_until(lambda: _pid_of(pidfile), timeout=30, message="the agent started the run")
    assert _phase(server, "c4") == "Starting"  # its start is not reported yet
    assert server.cli("cancel", "job/c4").code == 0
    status = settled(server, "c4")["c4"]["status"]
    assert not _alive(pid), "the job was Cancelled while its run lived on its node"
    assert status["outcome"] == "Cancelled"
    (run,) = status["runs"]  # the run the agent started, recorded and stopped
    assert (run["node"], run["outcome"]) == ("far", "Cancelled")


def test_a_stop_of_a_starting_run_holds_its_slots_while_the_agent_is_silent(serve, sqlite_url, agents, tmp_path):
    """The agent does not answer (stopped, as a partition leaves it) when the run is placed and
    cancelled: the job stays Stopping with its slots until the agent is back and says what it
    did; no process of the job is left when it is Cancelled."""
    server = serve(sqlite_url, "--no-local-node")
    agent = agents(server, "agent")
    _node_up(server)
    os.killpg(agent.pid, signal.SIGSTOP)
    pidfile = tmp_path / "c4.pid"
    _apply(server, job_manifest("c4", _recording(pidfile), stopGracePeriod="2s"))
    wait_until(lambda: _phase(server, "c4") == "Starting", timeout=30)
    assert server.cli("cancel", "job/c4").code == 0
    wait_until(lambda: _phase(server, "c4") == "Stopping", timeout=30, message="Stopping, not Cancelled at once")
    held = server.http().get(f"{PREFIX}/nodes/far/held").json()
    assert "c4" in str(held), held  # its slots are still held there
    os.killpg(agent.pid, signal.SIGCONT)
    status = settled(server, "c4")["c4"]["status"]
    assert status["outcome"] == "Cancelled"
    pid = _pid_of(pidfile)
    assert pid is None or not _alive(pid)


def test_a_server_down_longer_than_lost_after_does_not_lose_a_healthy_remote_run(serve, sqlite_url, agents, tmp_path):
    """kill -9 of the server, down longer than the job's retry.lostAfter: the agent kept its
    run and posts heartbeats again once the server is back; the silence while no controller
    was up is not counted against the node, so the run is not Lost (nor killed)."""
    env = {"RECONCILER_NODE_LOST_AFTER": "3s"}
    server = serve(sqlite_url, "--no-local-node", env=env)
    agents(server, "agent")
    _node_up(server)
    pidfile = tmp_path / "kept.pid"
    _apply(server, job_manifest("kept", _recording(pidfile), retry={"lostAfter": "6s"}))
    wait_until(lambda: _phase(server, "kept") == "Running", timeout=30)
    pid = _pid_of(pidfile)
    assert pid is not None
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    down_at = time.time()
    wait_until(lambda: time.time() - down_at > 8, timeout=20, interval=0.2, message="down past lostAfter")
    port = int(server.url.rsplit(":", 1)[1])
    log = (tmp_path / "serve-again.log").open("w")
    again = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "--store", sqlite_url, "serve", "--port", str(port), "--no-local-node"],
        stdout=log,
        stderr=log,
        start_new_session=True,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    try:
        back = Server(server.url, sqlite_url, again, Path(log.name))

        def beat_after_restart() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                beat = back.http().get(f"{PREFIX}/nodes/far").json().get("status", {}).get("heartbeatAt")
                return bool(beat) and beat > time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(down_at + 8))
            return False

        wait_until(beat_after_restart, timeout=60, interval=0.2, message="the agent posts heartbeats again")
        assert _alive(pid), "the healthy run was killed after the server's restart"
        assert back.cli("cancel", "job/kept").code == 0
        status = settled(back, "kept")["kept"]["status"]
        assert [r["outcome"] for r in status["runs"]] == ["Cancelled"], status
    finally:
        os.killpg(again.pid, signal.SIGTERM)
        again.wait(timeout=20)


def test_runs_and_reports_are_refused_to_an_agent_that_does_not_serve_the_node(serve, sqlite_url, agents):
    server = serve(sqlite_url, "--no-local-node")
    agents(server, "agent")
    _node_up(server)
    other = {"X-Reconciler-Agent": "elsewhere:1:2.0"}
    runs = server.http().get(f"{PREFIX}/nodes/far/runs", params={"timeoutSeconds": 0}, headers=other)
    assert runs.status_code == 409 and "is served by the agent" in runs.json()["message"], runs.text
    reports = server.http().post(f"{PREFIX}/nodes/far/runs/reports", json={"items": []}, headers=other)
    assert reports.status_code == 409, reports.text


def test_an_agent_the_server_found_serving_is_refused_on_a_waiting_poll_once_replaced(serve, sqlite_url):
    """The server remembers the agent it last found serving a node, and that agent's polls
    read nothing before they wait: each answer is read with the check, so once a restarted
    agent on the same host has taken the node over, the old one's poll with the digest it
    holds (which waits) is refused (409), and its reports keep nothing."""
    server = serve(sqlite_url, "--no-local-node")
    http = server.http()
    old, new = {"X-Reconciler-Agent": "hostx:1:1.0"}, {"X-Reconciler-Agent": "hostx:2:2.0"}

    def beat(agent: dict[str, str]) -> None:
        body = {"agent": agent["X-Reconciler-Agent"], "address": "127.0.0.1", "capacity": {"slots": 1}}
        answer = http.post(f"{PREFIX}/nodes/far/heartbeat", json=body, headers=agent)
        assert answer.status_code == 200, answer.text

    beat(old)
    first = http.get(f"{PREFIX}/nodes/far/runs", params={"timeoutSeconds": 0}, headers=old)
    assert first.status_code == 200, first.text
    beat(new)  # the same host: a restarted agent, which takes the node over at once
    waited = http.get(
        f"{PREFIX}/nodes/far/runs", params={"timeoutSeconds": 0.3, "known": first.json()["digest"]}, headers=old
    )
    assert waited.status_code == 409 and "is served by the agent hostx:2:2.0" in waited.json()["message"], waited.text
    item = {"job": "j", "uid": "u", "run": 1, "epoch": 1, "startedAt": "2026-12-07T00:00:00Z", "pid": 5}
    reports = http.post(f"{PREFIX}/nodes/far/runs/reports", json={"items": [item]}, headers=old)
    assert reports.status_code == 409 and "is served by the agent" in reports.json()["message"], reports.text
    assert http.get(f"{PREFIX}/nodes/far/runs", params={"timeoutSeconds": 0}, headers=new).status_code == 200


def _hand_agent(server: Server, agent: str, *, quiet: bool) -> tuple[httpx.Client, dict[str, str], Callable]:
    """The test as node far's agent process `agent` (quiet: asking for quiet ends), its
    heartbeat accepted: a client, the agent's headers, and its long poll (known, timeout)."""
    http = server.http()
    headers = {"X-Reconciler-Agent": agent, **({"X-Reconciler-Quiet-Ends": "1"} if quiet else {})}
    body = {"agent": agent, "address": "127.0.0.1", "capacity": {"slots": 2}}
    assert http.post(f"{PREFIX}/nodes/far/heartbeat", json=body, headers=headers).status_code == 200

    def poll(known: str, timeout: float) -> dict:
        params = {"timeoutSeconds": timeout, "known": known}
        answer = http.get(f"{PREFIX}/nodes/far/runs", params=params, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()

    return http, headers, poll


@pytest.mark.parametrize(("quiet", "route"), [(True, "reports"), (True, "report"), (False, "reports")])
def test_a_run_whose_end_the_polling_agent_reported_leaves_without_an_answer(serve, sqlite_url, quiet, route):
    """Each run's end used to answer its agent's long poll twice: once as the run left the
    node (which the agent knew: it had reported the end) and again for the next run. For an
    agent that asks so (X-Reconciler-Quiet-Ends), a run gone whose end that agent reported,
    by either report route, no longer answers its poll; the next change does, and the poll's
    timeout answers with the runs as they are. An agent that does not ask (an older one,
    which acts again on any answer it holds) is answered as before."""
    server = serve(sqlite_url, "--no-local-node")
    http, agent, poll = _hand_agent(server, "hosty:1:1.0", quiet=quiet)

    def jobs(answer: dict) -> list[str]:
        return sorted(item["job"] for item in answer["items"])

    def end(item: dict) -> None:
        report = {"uid": item["uid"], "run": item["run"], "epoch": item["epoch"]}
        report.update(startedAt="2026-12-07T00:00:00Z", finishedAt="2026-12-07T00:00:01Z")
        if route == "reports":
            items = [{"job": item["job"], **report}]
            answer = http.post(f"{PREFIX}/nodes/far/runs/reports", json={"items": items}, headers=agent)
            assert [i["code"] for i in answer.json()["items"]] == [200], answer.text
        else:
            answer = http.post(f"{PREFIX}/nodes/far/runs/{item['job']}/report", json=report, headers=agent)
            assert answer.status_code == 200, answer.text

    _apply(server, job_manifest("one"))
    held = poll("", 0)
    while jobs(held) != ["one"]:
        held = poll(held["digest"], 10)
    waiting: dict = {}
    poller = threading.Thread(target=lambda: waiting.update(poll(held["digest"], 30)))
    poller.start()
    end(held["items"][0])
    settled(server, "one")  # its run has left the node
    if not quiet:
        poller.join(timeout=30)
        assert not poller.is_alive() and jobs(waiting) == [], waiting  # answered for the run gone
        return
    _apply(server, job_manifest("two"))
    poller.join(timeout=60)
    assert jobs(waiting) == ["two"], waiting  # answered for the next run, which also says "one" is gone

    end(waiting["items"][0])
    settled(server, "two")
    timed_out = poll(waiting["digest"], 0.5)
    assert jobs(timed_out) == [] and timed_out["digest"] != waiting["digest"], timed_out


def test_a_run_leaving_that_the_quiet_agent_did_not_report_ended_is_answered(serve, sqlite_url):
    """An agent that asked for quiet ends and reported one run ended is still answered at
    once when another run leaves its node without an end it reported: here the node goes
    silent (the test is its agent, and stops beating) and the run it reported started is
    declared lost (`retry.lostAfter`). The poll answers well before its 30 s timeout."""
    server = serve(sqlite_url, "--no-local-node", env={"RECONCILER_NODE_LOST_AFTER": "1s"})
    http, agent, poll = _hand_agent(server, "hostz:1:1.0", quiet=True)

    def report(item: dict, **facts: object) -> None:
        items = [{"job": item["job"], "uid": item["uid"], "run": item["run"], "epoch": item["epoch"], **facts}]
        answer = http.post(f"{PREFIX}/nodes/far/runs/reports", json={"items": items}, headers=agent)
        assert [i["code"] for i in answer.json()["items"]] == [200], answer.text

    _apply(server, job_manifest("one"), job_manifest("lost", retry={"limit": 0, "lostAfter": "2s"}))
    held = poll("", 0)
    while sorted(i["job"] for i in held["items"]) != ["lost", "one"]:
        held = poll(held["digest"], 10)
    by_job = {item["job"]: item for item in held["items"]}
    report(by_job["lost"], startedAt="2026-12-07T00:00:00Z", pid=1)
    report(by_job["one"], startedAt="2026-12-07T00:00:00Z", finishedAt="2026-12-07T00:00:01Z")
    settled(server, "one")
    waiting: dict = {}
    poller = threading.Thread(target=lambda: waiting.update(poll(held["digest"], 30)))
    poller.start()
    settled(server, "lost")  # no heartbeat since: the node is NotReady, then the run Lost
    poller.join(timeout=20)  # under the poll's 30 s
    assert not poller.is_alive() and waiting["items"] == [], waiting
    assert server.job("lost")["status"]["runs"][0]["outcome"] == "Lost"


def test_a_look_again_at_a_held_answer_acts_only_on_the_runs_it_skipped(tmp_path):
    """The server no longer answers a run leaving whose end the agent reported, so the answer
    the agent holds may still list it, as not started (a short run's start and end are
    reported together), after the sweep removed its folder and record (its job deleted). A
    look taken again at that answer, for a run it skipped (a service's next run waiting for
    the last to settle), acts on the skipped run alone: the ended one is not started again."""
    agent = NodeAgent(Options(server="http://127.0.0.1:9", node="far", state_dir=tmp_path / "state"))
    try:
        spec = {"command": ["true"]}
        ended = {"job": "ended", "uid": "u-1", "run": 1, "epoch": 3, "spec": spec, "started": False}
        waiting = {"job": "next", "uid": "u-2", "run": 2, "epoch": 4, "spec": spec, "started": False}
        agent._last_items, agent._received, agent._skipped = [ended, waiting], time.monotonic(), {"next"}
        agent._look_again()
        # no lease (no heartbeat accepted): a run the look starts waits for one, skipped again
        assert agent._skipped == {"next"}, agent._skipped  # the ended run was not looked at: not started
    finally:
        agent.stop()


def test_a_look_again_keeps_the_skips_it_was_not_asked_to_look_at(tmp_path):
    """An artifact-ready start runs on the exit watcher's thread, outside the look's lock, and
    may skip its run (no lease) after a look again took the skipped jobs it acts on. That skip
    is kept for the next look again (at the next accepted heartbeat): the long poll's next
    answer may be 30 s away, since a run's end the agent reported is no news to it."""
    agent = NodeAgent(Options(server="http://127.0.0.1:9", node="far", state_dir=tmp_path / "state"))
    try:
        spec = {"command": ["true"]}
        waiting = {"job": "next", "uid": "u-2", "run": 2, "epoch": 4, "spec": spec, "started": False}
        fetched = {"job": "fetched", "uid": "u-3", "run": 1, "epoch": 5, "spec": spec, "started": False}
        agent._last_items, agent._received = [waiting, fetched], time.monotonic()
        agent._skipped = {"next", "fetched"}  # "fetched" skipped after the look took {"next"}
        agent._reconcile(agent._last_items, only={"next"})
        assert agent._skipped == {"next", "fetched"}, agent._skipped
    finally:
        agent.stop()


def _other_host(name: str) -> list[str]:
    """Run under another host name (a UTS namespace): another machine, as the server tells them."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh"]


def test_an_agent_whose_heartbeat_is_not_accepted_neither_starts_nor_reports_runs(serve, sqlite_url, agents, tmp_path):
    """A second agent for a served node learns of no run before its heartbeat is accepted (a
    duplicate is refused there): here its heartbeat is refused as invalid (a bad label), so it
    is never accepted. It used to poll at once and report the real agent's run gone (Lost)."""
    server = serve(sqlite_url, "--no-local-node")
    agents(server, "agent")
    _node_up(server)
    pidfile = tmp_path / "real.pid"
    _apply(server, job_manifest("real", _recording(pidfile)))
    wait_until(lambda: _phase(server, "real") == "Running", timeout=30)
    agents(server, "duplicate", extra=["--label", "bad key=x"])
    log = tmp_path / "duplicate.log"
    wait_until(lambda: log.read_text().count("heartbeat failed") >= 3, timeout=30, message="refused heartbeats")
    assert not list((tmp_path / "duplicate" / "runs").glob("*/agent.json")), "the duplicate acted on runs"
    assert _phase(server, "real") == "Running" and _alive(_pid_of(pidfile) or 0)
    assert server.cli("cancel", "job/real").code == 0
    done = settled(server, "real")
    assert [r["outcome"] for r in done["real"]["status"]["runs"]] == ["Cancelled"]


def test_an_agent_replaced_by_another_hosts_agent_stops_its_runs_before_it_exits(serve, sqlite_url, agents, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a second host name needs unshare --uts (root)")
    server = serve(sqlite_url, "--no-local-node", env={"RECONCILER_NODE_LOST_AFTER": "2s"})
    old = agents(server, "old")
    _node_up(server)
    pidfile = tmp_path / "held.pid"
    _apply(server, job_manifest("held", _recording(pidfile), stopGracePeriod="1s"))
    wait_until(lambda: _phase(server, "held") == "Running", timeout=30)
    pid = _pid_of(pidfile)
    assert pid is not None
    os.killpg(old.pid, signal.SIGSTOP)  # partitioned: its heartbeats stop, its run goes on

    def stale() -> bool:
        conditions = server.http().get(f"{PREFIX}/nodes/far").json().get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] != "True" for c in conditions)

    wait_until(stale, timeout=30, interval=0.1, message="far is NotReady")
    agents(server, "new", wrap=_other_host("new-machine"))  # takes the node over once it is stale

    def served_by_new() -> bool:
        agent = server.http().get(f"{PREFIX}/nodes/far").json().get("status", {}).get("agent", "")
        return agent.startswith("new-machine:")

    wait_until(served_by_new, timeout=30, interval=0.1, message="the new agent serves far")
    os.killpg(old.pid, signal.SIGCONT)  # healed: its heartbeat is refused
    assert old.wait(timeout=60) == 1
    wait_until(lambda: not _alive(pid), timeout=10, message="the replaced agent's run is gone")
    assert "stopped the 1 run(s) this agent held" in (tmp_path / "old.log").read_text()


def test_the_next_run_after_a_stale_one_starts_once_the_stale_one_has_ended(serve, sqlite_url, agents, tmp_path):
    """Run 1 is declared lost while the agent is silent (lostAfter); the retry is placed on the
    same node when it is back. The agent stops run 1 (its report is refused) and starts run
    2 when run 1 has ended, not at its long poll's next answer, up to 30 s later."""
    server = serve(sqlite_url, "--no-local-node", env={"RECONCILER_NODE_LOST_AFTER": "1s"})
    agent = agents(server, "agent")
    _node_up(server)
    first = tmp_path / "first.pid"
    # run 1 takes 4 s to end when stopped: run 2 is placed on the node while it still ends
    lingers = f"echo $$ > {first}; trap 'sleep 4; exit 1' TERM; while :; do sleep 0.1; done"
    script = f"if [ -e {first} ]; then exec sleep 600; fi; {lingers}"
    retry = {"limit": 1, "lostAfter": "2s", "backoff": {"delay": "0s"}}
    spec = {"shell": script, "retry": retry, "stopGracePeriod": "20s"}
    _apply(server, {**job_manifest("again"), "spec": spec})
    wait_until(lambda: _phase(server, "again") == "Running", timeout=30)
    pid = _pid_of(first)
    assert pid is not None
    os.killpg(agent.pid, signal.SIGSTOP)
    wait_until(lambda: server.job("again")["status"]["runs"][0].get("outcome") == "Lost", timeout=30)
    os.killpg(agent.pid, signal.SIGCONT)
    wait_until(lambda: not _alive(pid), timeout=30, message="the stale run 1 is stopped")
    ended = time.monotonic()

    def second_started() -> bool:
        runs = server.job("again")["status"].get("runs", [])
        return len(runs) == 2 and _phase(server, "again") == "Running"

    # well under the long poll's 30 s, the only other look that would start it
    wait_until(second_started, timeout=20, interval=0.1, message="run 2 started after run 1 ended")
    assert time.monotonic() - ended < 20
    assert server.cli("cancel", "job/again").code == 0
    settled(server, "again")


def test_an_agent_whose_token_the_server_refuses_exits_2_naming_the_token(serve, sqlite_url, tmp_path):
    admin = "admin-" + "a" * 26
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{admin} admin\n{'agent-' + 'b' * 26} agent far\n")
    server = serve(sqlite_url, "--tokens", str(tokens), "--no-local-node", token=admin)
    argv = ["--server", server.url, "--token", "unknown-" + "c" * 26, "agent", "--node", "far", "--log-port", "0"]
    argv += ["--state-dir", str(tmp_path / "agent")]
    refused = subprocess.run(
        [sys.executable, "-m", "reconciler", *argv], capture_output=True, text=True, timeout=30, start_new_session=True
    )
    assert refused.returncode == 2, refused.stderr
    assert "refused this agent's token for node far (HTTP 401" in refused.stderr, refused.stderr


def _held(server: Server, job: str) -> bool:
    return job in str(server.http().get(f"{PREFIX}/nodes/far/held").json())


def _serve_again(server: Server, tmp_path: Path, env: dict) -> Server:
    """The server, killed before, started again on its port and store; stopped by the caller."""
    port = int(server.url.rsplit(":", 1)[1])
    log = (tmp_path / "serve-again.log").open("w")
    again = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "--store", server.store, "serve", "--port", str(port), "--no-local-node"],
        stdout=log,
        stderr=log,
        start_new_session=True,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    back = Server(server.url, server.store, again, Path(log.name))

    def healthy() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{back.url}/healthz", timeout=2).text == "ok"
        return False

    wait_until(healthy, timeout=30, interval=0.05, message="the server answers again")
    return back


def _beat(server: Server, agent: str, **extra) -> httpx.Response:
    """A heartbeat for node far as an agent would post it (an older one: no `withdraws`)."""
    body = {"agent": agent, "address": "127.0.0.1", "capacity": {"slots": 2}, **extra}
    return server.http().post(f"{PREFIX}/nodes/far/heartbeat", json=body)


def test_a_stopped_starting_run_on_an_older_agents_node_frees_its_slots_at_once(serve, sqlite_url, tmp_path):
    """An agent of the previous version skips a stop of a run it never started, so it never
    says Withdrawn: its node (no `withdraws` in its heartbeat) frees the slots at the stop, as
    before, instead of holding them Stopping for ever."""
    server = serve(sqlite_url, "--no-local-node")
    assert _beat(server, "oldhost:1:1.0").status_code == 200  # it never polls: the run stays Starting
    _apply(server, job_manifest("c1", ["true"]))
    wait_until(lambda: _phase(server, "c1") == "Starting", timeout=30)
    assert server.cli("cancel", "job/c1").code == 0
    status = settled(server, "c1")["c1"]["status"]
    assert status["outcome"] == "Cancelled" and not status.get("runs")
    assert not _held(server, "c1")


def _long_poll(path: str) -> bool:
    """A runs request the server may hold (the agent's long poll), not a look at once (timeoutSeconds=0)."""
    return "/runs?" in path and parse_qs(urlsplit(path).query).get("timeoutSeconds") != ["0"]


class _Proxy:
    """Between an agent and the server: holds the long poll's answers that place a run while
    `hold` is set (all of them once `release` is set, one more at each `let_one`), and refuses
    its heartbeats (503) while `refuse` is set: a late answer, and a link that lets the
    heartbeats through no more. A runs request answered at once is never held."""

    def __init__(self, target: str):
        proxy = self
        self.hold, self.holding, self.release = threading.Event(), threading.Event(), threading.Event()
        self.refuse = threading.Event()
        self._passes = threading.Semaphore(0)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/heartbeat") and proxy.refuse.is_set():
                    self._answer(503, b'{"message": "refused by the test"}')
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, target + self.path, content=body, headers=headers, timeout=120)
                if _long_poll(self.path) and proxy.hold.is_set() and answer.json().get("items"):
                    proxy.holding.set()
                    proxy._held()
                self._answer(answer.status_code, answer.content)

            def _answer(self, code: int, content: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def do_GET(self) -> None:
                self._forward()

            def do_POST(self) -> None:
                self._forward()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _held(self) -> None:
        """An answer held until it may go on (60 s at most)."""
        deadline = time.monotonic() + 60
        while not self.release.is_set() and time.monotonic() < deadline:
            if self._passes.acquire(timeout=0.05):
                return

    def let_one(self) -> None:
        """One held answer (the one held now, or the next) goes on."""
        self._passes.release()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _behind_a_proxy(serve, sqlite_url, agents) -> tuple[Server, _Proxy]:
    """A server whose node goes NotReady 3 s after its last heartbeat, and agent `far`
    talking to it through a proxy, registered."""
    server = serve(sqlite_url, "--no-local-node", env={"RECONCILER_NODE_LOST_AFTER": "3s"})
    proxy = _Proxy(server.url)
    try:
        agents(SimpleNamespace(url=proxy.url), "agent")
        _node_up(server)
        wait_until(lambda: server.http().get(f"{PREFIX}/nodes/far").json().get("status", {}).get("heartbeatAt"))
    except BaseException:
        proxy.close()
        raise
    return server, proxy


def _not_ready(server: Server) -> bool:
    conditions = server.http().get(f"{PREFIX}/nodes/far").json().get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] != "True" for c in conditions)


def test_an_agent_starts_nothing_once_its_last_accepted_heartbeat_is_older_than_the_window(
    serve, sqlite_url, agents, tmp_path
):
    """A long poll's answer that places a run reaches the agent late, after its heartbeats
    went unaccepted for longer than the server's Ready window (another host's agent may serve
    the node by then): it starts the run only once a heartbeat is accepted again."""
    server, proxy = _behind_a_proxy(serve, sqlite_url, agents)
    try:
        proxy.hold.set()
        pidfile = tmp_path / "late.pid"
        _apply(server, job_manifest("late", _recording(pidfile), stopGracePeriod="1s"))
        wait_until(proxy.holding.is_set, timeout=30, message="the answer placing the run is held")
        proxy.refuse.set()
        wait_until(lambda: _not_ready(server), timeout=30, interval=0.1, message="far is NotReady: the lease is over")
        proxy.hold.clear()
        proxy.release.set()
        log = tmp_path / "agent.log"
        waits = "waits for an accepted heartbeat"
        wait_until(lambda: pidfile.exists() or waits in log.read_text(), timeout=30, message="the answer acted on")
        assert not pidfile.exists(), "the agent started a run with no heartbeat accepted within the window"
        proxy.refuse.clear()
        wait_until(lambda: _phase(server, "late") == "Running", timeout=30, message="started once a beat is accepted")
        assert server.cli("cancel", "job/late").code == 0
        assert settled(server, "late")["late"]["status"]["outcome"] == "Cancelled"
    finally:
        proxy.close()


def test_an_answer_received_before_the_lease_is_renewed_is_asked_anew_before_it_is_acted_on(
    serve, sqlite_url, agents, tmp_path
):
    """The long poll's answer placing a run reaches the agent after its lease ran out; the job
    is cancelled before a heartbeat is accepted again. Once one is, the agent asks for its
    node's runs anew (runs("", 0)) instead of acting on the answer it holds: it withdraws the
    run and never starts it. The long poll's later answers are all held here, so only that
    fresh answer can tell the agent of the cancel."""
    server, proxy = _behind_a_proxy(serve, sqlite_url, agents)
    try:
        proxy.hold.set()
        marker = tmp_path / "marker"
        _apply(server, job_manifest("stale", ["sh", "-c", f"touch {marker}; exec sleep 600"]))
        wait_until(proxy.holding.is_set, timeout=30, message="the answer placing the run is held")
        proxy.refuse.set()
        wait_until(lambda: _not_ready(server), timeout=30, interval=0.1, message="far is NotReady: the lease is over")
        proxy.let_one()  # the held answer, which places the run, reaches the agent
        log = tmp_path / "agent.log"
        waits = "run 1 of job stale waits for an accepted heartbeat"
        wait_until(lambda: waits in log.read_text(), timeout=30, message="the late answer acted on")
        assert server.cli("cancel", "job/stale").code == 0
        wait_until(lambda: _phase(server, "stale") == "Stopping", timeout=30, message="held until the agent says")
        proxy.refuse.clear()  # a heartbeat is accepted again: the answer the agent holds is older
        wait_until(
            lambda: marker.exists() or _phase(server, "stale") == "Completed",
            timeout=20,
            message="the run withdrawn (or started)",
        )
        assert not marker.exists(), "the agent started the run from the answer it had before its lease ran out"
        status = server.job("stale")["status"]
        assert status["outcome"] == "Cancelled" and not status.get("runs"), status
    finally:
        proxy.close()


class _OlderServer:
    """A server of the version before, as far as an agent's heartbeat goes: it refuses the
    field `withdraws` (422, as its validation words it) and accepts a heartbeat without it.
    Its runs request is held (nothing placed) until `close`."""

    def __init__(self) -> None:
        older = self
        self.beats: list[dict] = []
        self.polled, self.closing = threading.Event(), threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.endswith("/nodes/far/heartbeat"):
                    self._answer(404, {"code": 404, "message": "no such route"})
                    return
                older.beats.append(body)
                if "withdraws" in body:
                    self._answer(422, {"code": 422, "message": "withdraws: Extra inputs are not permitted"})
                else:
                    self._answer(200, {"code": 200, "message": "node far is Ready", "readyWindowSeconds": 40})

            def do_GET(self) -> None:
                if "/nodes/far/runs?" not in self.path:
                    self._answer(404, {"code": 404, "message": "no such route"})
                    return
                older.polled.set()
                older.closing.wait(30)
                self._answer(200, {"items": [], "digest": "none"})

            def _answer(self, code: int, document: dict) -> None:
                content = json.dumps(document).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_agent_leaves_withdraws_out_of_its_heartbeat_for_a_server_that_refuses_it(agents, tmp_path):
    """A server of the version before answers 422 to a heartbeat with `withdraws`: the agent
    sends its next heartbeat without the field, is accepted, and goes on to follow its runs
    (which it asks for only once a heartbeat is accepted)."""
    older = _OlderServer()
    try:
        agents(SimpleNamespace(url=older.url), "agent")
        wait_until(older.polled.is_set, timeout=20, message="the agent, accepted, asks for its runs")
        first, *after = list(older.beats)
        assert first.get("withdraws") is True, first
        assert after, "no heartbeat after the refused one"
        assert all("withdraws" not in beat for beat in after), after
        assert "takes no `withdraws`" in (tmp_path / "agent.log").read_text()
    finally:
        older.close()


def test_a_replaced_agent_starts_nothing_after_it_stopped_its_runs(serve, sqlite_url, tmp_path):
    """_stop_runs (the node taken over) lists the runs to stop once: a start racing it would
    outlive the agent. After it, no look starts a run, whatever its lease says."""
    from reconciler.nodeagent.daemon import NodeAgent, Options

    server = serve(sqlite_url, "--no-local-node")
    agent = NodeAgent(Options(server=server.url, node="far", state_dir=tmp_path / "agent"))
    try:
        agent._lease_until = float("inf")  # as if a heartbeat had just been accepted
        assert agent._stop_runs() == 0
        pidfile = tmp_path / "raced.pid"
        spec = job_manifest("raced", _recording(pidfile))["spec"]
        agent.reconcile([{"job": "raced", "uid": "u1", "run": 1, "epoch": 1, "spec": spec, "started": False}])
        assert not list((tmp_path / "agent" / "runs").glob("*/agent.json")), "a run started after the takeover"
    finally:
        agent.stop()
        pid = _pid_of(pidfile)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def test_a_run_that_ended_while_its_agent_was_down_is_reported_with_its_exit_not_withdrawn(
    serve, sqlite_url, agents, tmp_path
):
    """The agent started the run and died before its record was written (agent.json removed
    here); the job is cancelled and the run ends (exit 3) while the agent is down. The agent
    back sees the stop of a run it has no record of: its exit record says it ran, so it is
    reported started and finished with its exit code, not Withdrawn."""
    server = serve(sqlite_url, "--no-local-node")
    agent = agents(server, "agent", env={"RECONCILER_START_REPORT_DELAY": "120"})
    _node_up(server)
    pidfile, go = tmp_path / "ended.pid", tmp_path / "go"
    script = f"echo $$ > {pidfile}; while [ ! -e {go} ]; do sleep 0.1; done; exit 3"
    _apply(server, {**job_manifest("ended"), "spec": {"shell": script, "stopGracePeriod": "1s"}})
    records = tmp_path / "agent" / "runs"
    record = wait_until(lambda: next(records.glob("ended.*/agent.json"), None), timeout=30, message="started")
    pid = wait_until(lambda: _pid_of(pidfile), timeout=30)
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()
    record.unlink()  # as a crash between the start and its record leaves it
    assert _phase(server, "ended") == "Starting"
    assert server.cli("cancel", "job/ended").code == 0
    wait_until(lambda: _phase(server, "ended") == "Stopping", timeout=30)
    go.touch()
    wait_until(lambda: not _alive(pid) and (record.parent / "exit").exists(), timeout=30, message="the run ended")
    agents(server, "agent")
    status = settled(server, "ended")["ended"]["status"]
    (run,) = status["runs"]
    assert run.get("exitCode") == 3, status
    # the agent back dates the start at its return, after the exit record: never an end before it
    assert to_epoch(run["finishedAt"]) >= to_epoch(run["startedAt"]), run
    assert not _held(server, "ended")


def test_a_report_the_server_refuses_as_invalid_does_not_hold_back_the_others(serve, sqlite_url, agents, tmp_path):
    """A run's record changed by hand (here a field of the wrong type) while its agent was
    down: the server refuses the batch of reports that holds it (422). The agent back sends
    them one at a time, so the other run's end is kept, and gives up the refused one, saying
    so, instead of sending the same batch for good."""
    server = serve(sqlite_url, "--no-local-node")
    agent = agents(server, "agent", env={"RECONCILER_START_REPORT_DELAY": "120"})
    _node_up(server)
    go = tmp_path / "go"
    for name in ("good", "bad"):
        script = f"while [ ! -e {go} ]; do sleep 0.1; done"
        _apply(server, {**job_manifest(name), "spec": {"shell": script, "stopGracePeriod": "1s"}})
    runs = tmp_path / "agent" / "runs"
    records = {
        name: wait_until(lambda n=name: next(runs.glob(f"{n}.*/agent.json"), None), timeout=30, message=name)
        for name in ("good", "bad")
    }
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()
    bad = json.loads(records["bad"].read_text())
    records["bad"].write_text(json.dumps({**bad, "ready_message": 5}))  # a text field holding a number
    go.touch()
    wait_until(lambda: all((r.parent / "exit").exists() for r in records.values()), timeout=30, message="ended")
    agents(server, "agent")
    done = settled(server, "good")["good"]["status"]
    assert done["outcome"] == "Succeeded", done
    wait_until(lambda: "its report was refused as invalid" in (tmp_path / "agent.log").read_text(), timeout=30)
    log = (tmp_path / "agent.log").read_text()
    assert "job bad" in log, log


def test_a_takeover_right_after_a_server_restart_waits_for_the_window(serve, sqlite_url, tmp_path):
    """The node's last heartbeat is stale only because the server was down: another host's
    agent is answered 503 (retried) until the server has been up for the Ready window, so the
    node's own agent, alive, is heard first; after it, the usual rule."""
    env = {"RECONCILER_NODE_LOST_AFTER": "4s"}
    server = serve(sqlite_url, "--no-local-node", env=env)
    assert _beat(server, "first-host:1:1.0").status_code == 200
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    down_at = time.time()
    wait_until(lambda: time.time() - down_at > 5, timeout=20, interval=0.2, message="down past the window")
    back = _serve_again(server, tmp_path, env)
    try:
        early = _beat(back, "other-host:1:1.0")
        assert early.status_code == 503, early.text
        assert "may take it over at" in early.json()["message"]
        wait_until(lambda: _beat(back, "other-host:1:1.0").status_code == 200, timeout=30, interval=0.2)
        assert back.http().get(f"{PREFIX}/nodes/far").json()["status"]["agent"] == "other-host:1:1.0"
    finally:
        os.killpg(back.proc.pid, signal.SIGTERM)
        back.proc.wait(timeout=20)


def test_a_run_stopped_while_its_agent_was_down_is_withdrawn_and_never_starts(serve, sqlite_url, agents, tmp_path):
    """The agent is down (killed) when the run is placed and cancelled: the job holds its
    slots, Stopping. The agent back gets the stop in its first answer: it reports the run
    never started (Withdrawn) and never starts it; the job is Cancelled, its slots freed."""
    server = serve(sqlite_url, "--no-local-node")
    agent = agents(server, "agent")
    _node_up(server)
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()
    marker = tmp_path / "marker"
    _apply(server, job_manifest("w", ["sh", "-c", f"touch {marker}; exec sleep 600"]))
    wait_until(lambda: _phase(server, "w") == "Starting", timeout=30)
    assert server.cli("cancel", "job/w").code == 0
    wait_until(lambda: _phase(server, "w") == "Stopping", timeout=30)
    assert _held(server, "w")
    agents(server, "agent")
    status = settled(server, "w")["w"]["status"]
    assert status["outcome"] == "Cancelled" and not status.get("runs"), status
    assert not marker.exists(), "the withdrawn run started"
    (record,) = (tmp_path / "agent" / "runs").glob("w.*/agent.json")
    assert '"Withdrawn"' in record.read_text()
    assert not _held(server, "w")


def test_drain_force_frees_a_withdrawn_run_whose_agent_is_silent(serve, sqlite_url, agents, tmp_path):
    """A stopped Starting run waits for its agent's word; drain --force is the operator's word
    that nothing runs there: the job is Cancelled and its slots freed without the agent."""
    server = serve(sqlite_url, "--no-local-node")
    agent = agents(server, "agent")
    _node_up(server)
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()
    _apply(server, job_manifest("d", ["sleep", "600"]))
    wait_until(lambda: _phase(server, "d") == "Starting", timeout=30)
    assert server.cli("cancel", "job/d").code == 0
    wait_until(lambda: _phase(server, "d") == "Stopping", timeout=30)
    assert server.cli("drain", "--force", "node/far").code == 0
    assert settled(server, "d")["d"]["status"]["outcome"] == "Cancelled"
    assert not _held(server, "d")


def test_runs_and_reports_of_the_servers_own_node_are_refused_to_any_agent(serve, sqlite_url):
    """The server's controller serves its own node: an agent (a token issued for that name,
    an older agent that names itself in no header) learns of none of its runs, and a report on
    one is refused (409), not kept unread."""
    from reconciler.controller.nodes import local_node_name

    server = serve(sqlite_url)
    http, node = server.http(), local_node_name()
    wait_until(lambda: http.get(f"{PREFIX}/nodes/{node}").status_code == 200, timeout=30)
    _apply(server, job_manifest("own", ["sleep", "30"]))
    wait_until(lambda: _phase(server, "own") == "Running", timeout=30)
    for headers in ({}, {"X-Reconciler-Agent": "elsewhere:1:2.0"}):
        runs = http.get(f"{PREFIX}/nodes/{node}/runs", params={"timeoutSeconds": 0}, headers=headers)
        assert runs.status_code == 409 and "is served by the controller" in runs.json()["message"], runs.text
        uid = http.get(f"{PREFIX}/jobs/own").json()["metadata"]["uid"]
        item = {"job": "own", "uid": uid, "run": 1, "epoch": 1, "finishedAt": "2026-12-07T00:00:00Z", "exitCode": 0}
        for items in ([item], []):
            reports = http.post(f"{PREFIX}/nodes/{node}/runs/reports", json={"items": items}, headers=headers)
            assert reports.status_code == 409 and "is served by the controller" in reports.json()["message"], (
                items,
                reports.text,
            )
    assert _phase(server, "own") == "Running"


def test_a_sweep_asks_only_about_ended_and_reported_runs_and_removes_those_not_kept(serve, sqlite_url, tmp_path):
    """The agent's look for run folders to remove (nodeagent/sweep.py), against a store that
    keeps no job: a run whose end was reported goes; a run still alive, one whose end is not
    reported yet, one taken on under another registration of the node (another store's) or
    by an older agent (no registration recorded), a folder without a record and one of the
    earlier layout stay, whatever the store says (the server is asked only about the first)."""
    from reconciler.nodeagent.daemon import NodeAgent, Options
    from reconciler.nodeagent.records import Record

    server = serve(sqlite_url, "--no-local-node")
    runs = tmp_path / "agent" / "runs"
    agent = NodeAgent(Options(server=server.url, node="far", state_dir=tmp_path / "agent"))
    try:
        registered = agent.api.heartbeat(agent._beat_body())["nodeUid"]  # the node, registered in this store

        def folder(name: str, **facts: object) -> Path:
            path = runs / name
            path.mkdir(parents=True)
            job, uid, run = name.split(".")
            Record(job, uid, int(run), 1, str(path), **{"node_uid": registered, **facts}).save()  # type: ignore[arg-type]
            return path

        ended = folder("ended.u1.1", finished_at="2026-12-07T00:00:00Z", start_reported=True, end_reported=True)
        done = {"finished_at": "2026-12-07T00:00:00Z", "start_reported": True, "end_reported": True}
        another = folder("another.u7.1", **{**done, "node_uid": "another-registration"})
        older = folder("older.u8.1", **{**done, "node_uid": None})
        alive = folder("alive.u2.1", pid=os.getpid(), process_start_time=1.0, start_reported=True)
        unreported = folder("unreported.u3.1", finished_at="2026-12-07T00:00:00Z", start_reported=True)
        held = folder("held.u4.1", finished_at="2026-12-07T00:00:00Z", start_reported=True, end_reported=True)
        agent._keep(Record("held", "u4", 1, 1, str(held), pid=os.getpid(), process_start_time=1.0))  # live here
        bare = runs / "bare.u5.1"
        bare.mkdir()
        legacy = runs / "old" / "u6" / "1"
        legacy.mkdir(parents=True)
        assert agent.sweep_once()
        assert not ended.exists()
        assert all(p.exists() for p in (alive, unreported, held, bare, legacy, another, older))
        (unreported / "agent.json").write_text(
            (unreported / "agent.json").read_text().replace('"end_reported": false', '"end_reported": true')
        )
        assert agent.sweep_once()  # its end taken since: asked about now, and not kept
        assert not unreported.exists() and alive.exists() and held.exists()
    finally:
        agent.stop()


def test_a_sweep_against_a_server_without_the_route_keeps_every_folder(tmp_path):
    """A server of the version before answers `runs/kept` 404: the agent keeps its folders."""
    from reconciler.nodeagent.daemon import NodeAgent, Options
    from reconciler.nodeagent.records import Record

    older = _OlderServer()
    agent = NodeAgent(Options(server=older.url, node="far", state_dir=tmp_path / "agent"))
    try:
        ended = tmp_path / "agent" / "runs" / "ended.u1.1"
        ended.mkdir(parents=True)
        Record(
            "ended", "u1", 1, 1, str(ended), finished_at="2026-12-07T00:00:00Z", end_reported=True, node_uid="n"
        ).save()
        assert agent.sweep_once() is False
        assert (ended / "agent.json").exists()
    finally:
        agent.stop()
        older.close()
