"""cordon, uncordon, drain [--force] node/NAME through the CLI with a real controller
(API.md section 3; section 2, "Nodes and agents": a run drained with --force is Lost,
reason NodeLost, and retried per onLost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from reconciler.api.annotations import LOST_RUN
from reconciler.apply import apply_manifests
from reconciler.commands import cancel, drain, set_unschedulable
from reconciler.controller.manager import Controller
from reconciler.controller.nodes import heartbeat, local_node_name
from reconciler.drain import runs_on
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import Store, eventlog
from reconciler.store import repository as repo
from tests.crash.harness import group_members
from tests.helpers import wait_until

from .conftest import held_until, job_yaml, node_yaml

NODE = local_node_name()


def registered(env) -> None:
    """The controller's node is stored (it registers on start)."""
    wait_until(lambda: NODE in env.ok("get", "nodes", "-o", "name").stdout, timeout=30, message="node registered")


def group_gone(pid: int) -> bool:
    """No live process in the run's group (the wrapper's pid); zombies do not count: init
    here does not reap the children of a controller that was killed."""
    return not group_members(pid)


def run_pid(env, name: str) -> int:
    status = env.wait_status(name, lambda s: s.get("phase") == "Running" and s["runs"][-1].get("pid"), what="Running")
    return int(status["runs"][-1]["pid"])


def test_cordon_holds_new_jobs_and_uncordon_lets_them_run(env):
    env.controller()
    registered(env)
    assert env.ok("cordon", f"node/{NODE}").stdout == f"node.reconciler.dev/{NODE} cordoned\n"
    assert env.ok("cordon", NODE).stdout == f"node.reconciler.dev/{NODE} unchanged\n"
    (line,) = env.ok("get", "nodes").stdout.splitlines()[1:]
    assert line.split()[:2] == [NODE, "Ready,SchedulingDisabled"]

    env.apply("held.yaml", job_yaml("held", "command: ['true']"))
    status = env.wait_status("held", lambda s: s.get("reason") == "Unschedulable", what="Unschedulable")
    assert status["phase"] == "Queued" and not status.get("runs")
    assert status["message"] == "0/1 nodes are available: 1 unschedulable (cordoned)"

    assert env.ok("uncordon", f"node/{NODE}").stdout == f"node.reconciler.dev/{NODE} uncordoned\n"
    assert env.ok("uncordon", f"node/{NODE}").stdout == f"node.reconciler.dev/{NODE} unchanged\n"
    env.wait_completed("held", timeout=30)  # woken by the node's change, not by a safety poll minutes later
    assert env.get_job("held")["status"]["outcome"] == "Succeeded"
    events = env.ok("get", "events", NODE).stdout
    assert "Cordoned" in events and "Uncordoned" in events

    for args, code in [
        (("cordon", "node/no-such-node"), 3),
        (("drain", "node/no-such-node"), 3),
        (("cordon", "job/held"), 2),
        (("drain", "--timeout", "soon", f"node/{NODE}"), 2),
    ]:
        assert env.cli(*args).code == code, args


def test_describe_node_lists_the_jobs_holding_slots_on_it(any_env):
    env = any_env
    go = env.root / "go"
    env.controller()
    registered(env)
    assert "(none holding slots)" in env.ok("describe", "node", NODE).stdout
    env.apply("held.yaml", job_yaml("holding", held_until(go) + "\nslots: 1"))
    env.wait_phase("holding", "Running")
    described = env.ok("describe", "node", NODE).stdout
    jobs = described.split("Jobs:", 1)[1]
    assert jobs.split()[:5] == ["NAME", "PHASE", "RUN", "SLOTS", "ADMITTED"]
    assert jobs.split()[5:9] == ["holding", "Running", "1", "1"]
    go.touch()
    env.wait_completed("holding")
    assert "(none holding slots)" in env.ok("describe", "node", NODE).stdout


def test_drain_waits_for_the_runs_on_the_node_to_end(env):
    env.controller()
    registered(env)
    release = env.root / "release"
    env.apply("held.yaml", job_yaml("held", held_until(release)))
    run_pid(env, "held")

    # on timeout: exit 1 naming the run still there; the node stays cordoned
    result = env.cli("drain", "--timeout", "1s", f"node/{NODE}")
    assert result.code == 1, result.stderr
    assert result.stdout == f"node.reconciler.dev/{NODE} cordoned\n"
    assert "timed out" in result.stderr and f"job/held run 1 (Running) on node/{NODE}" in result.stderr

    log = env.root / "drain.err"
    with open(log, "w") as stderr:
        drain = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "drain", f"node/{NODE}", "--timeout", "60s"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "RECONCILER_STORE": env.url, "XDG_STATE_HOME": str(env.xdg)},
        )
    try:
        wait_until(lambda: "waiting for job/held run 1 (Running)" in log.read_text(), message="drain says it waits")
        env.apply("later.yaml", job_yaml("later", "command: ['true']"))  # not placed on a node being drained
        env.wait_status("later", lambda s: s.get("reason") == "Unschedulable", what="Unschedulable")
        assert drain.poll() is None  # still waiting: the run has not ended
        release.touch()
        out, _ = drain.communicate(timeout=30)
    finally:
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode == 0, log.read_text()
    assert out == f"node.reconciler.dev/{NODE} unchanged\nnode.reconciler.dev/{NODE} drained\n"
    assert env.get_job("held")["status"]["outcome"] == "Succeeded"  # it ended on its own
    assert f"job/held run 1 left node/{NODE}" in log.read_text()
    assert env.status("later")["phase"] == "Queued"


LONG_RUN_THEN_SUCCEED = """shell: 'if [ "$RECONCILER_RUN" = 1 ]; then sleep 300; fi'
retry: {limit: 1, onLost: true, backoff: {delay: 100ms}}"""


def test_drain_force_stops_the_runs_and_records_them_lost(any_env):
    env = any_env  # on SQLite and on PostgreSQL
    env.controller()
    registered(env)
    env.apply("retried.yaml", job_yaml("retried", LONG_RUN_THEN_SUCCEED))
    env.apply("final.yaml", job_yaml("final", "command: [sleep, '300']\nretry: {limit: 3, onLost: false}"))
    pids = {name: run_pid(env, name) for name in ("retried", "final")}

    result = env.cli("drain", "--force", f"node/{NODE}", "--timeout", "60s")
    assert result.code == 0, result.stderr + env.controller_log()
    assert result.stdout == f"node.reconciler.dev/{NODE} cordoned\nnode.reconciler.dev/{NODE} drained\n"
    assert "job/final run 1" in result.stderr and "job/retried run 1" in result.stderr
    # drained means the slots are free, and slots are freed only once the processes are gone
    assert all(group_gone(pid) for pid in pids.values()), pids

    final = env.get_job("final")["status"]
    assert (final["phase"], final["outcome"], final["reason"]) == ("Completed", "Lost", "NodeLost")
    assert final["message"] == f"node {NODE} was drained with --force: run 1 declared lost"
    (run,) = final["runs"]
    assert (run["outcome"], run["reason"]) == ("Lost", "NodeLost")

    # onLost: retried, but the only node is cordoned
    retried = env.wait_status("retried", lambda s: s.get("reason") == "Unschedulable", what="Unschedulable")
    assert retried["phase"] == "Queued" and not retried.get("admission")
    assert [(r["outcome"], r["reason"]) for r in retried["runs"]] == [("Lost", "NodeLost")]

    env.ok("uncordon", f"node/{NODE}")
    env.wait_completed("retried", timeout=30)
    retried = env.get_job("retried")["status"]
    assert retried["outcome"] == "Succeeded"
    assert [(r["number"], r["outcome"]) for r in retried["runs"]] == [(1, "Lost"), (2, "Succeeded")]
    events = env.ok("describe", "job", "retried").stdout
    assert "NodeDrained" in events and "ended Lost" in events


def test_a_forced_drain_half_done_is_finished_by_the_next_controller(env):
    """The request is durable (an annotation on each job it covers), and so is the stop it
    starts: a controller killed in the middle of it leaves it to the next one, which kills
    the process group after the grace period and records the run Lost."""
    first = env.controller()
    registered(env)
    env.apply(
        "stubborn.yaml",
        # a grace period the controller is killed well within, however slow the drain's CLI
        job_yaml("stubborn", "shell: \"trap '' TERM; sleep 300\"\nstopGracePeriod: 10s\nretry: {onLost: false}"),
    )
    pid = run_pid(env, "stubborn")
    result = env.cli("drain", "--force", f"node/{NODE}", "--timeout", "500ms")
    assert result.code == 1 and "still there: job/stubborn run 1" in result.stderr, result.stderr
    env.wait_phase("stubborn", "Stopping")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    assert not group_gone(pid)  # SIGTERM is ignored, and nobody is left to send SIGKILL

    env.controller()
    result = env.cli("drain", f"node/{NODE}", "--timeout", "60s")
    assert result.code == 0, result.stderr + env.controller_log()
    assert group_gone(pid)
    status = env.get_job("stubborn")["status"]
    assert (status["outcome"], status["reason"]) == ("Lost", "NodeLost")
    assert status["runs"][0]["signal"] == signal.SIGKILL
    runs = [p for p in psutil.process_iter(["cmdline", "status"]) if str(env.root) in " ".join(p.info["cmdline"] or [])]
    assert all(p.info["status"] == psutil.STATUS_ZOMBIE for p in runs), runs


# -- admissions no agent has started, and nodes no agent serves (a wired controller, by hand) --

STALE = 60.0  # seconds: a heartbeat this old leaves its node NotReady


def wired_world(sqlite_url, tmp_path, text: str):
    store = Store(sqlite_url)
    manifests, problems = parse_text(text, "world.yaml", Path(tmp_path))
    assert not problems, problems
    apply_manifests(store, manifests)
    return store


def drive_until(wired, name: str, predicate, what: str) -> dict:
    def step():
        status = job_statuses(wired.store, [name])[name]
        if predicate(status):
            return status
        wired.jobs(name)
        return None

    return wait_until(step, timeout=15, interval=0.02, message=f"{name}: {what}")


def test_drain_force_sends_an_unstarted_admission_back_in_line(sqlite_url, tmp_path):
    """An admission whose run has not started when `drain --force` comes never starts there:
    no run is recorded (it is no attempt), the slots go back, the job keeps its place in
    line, and the request is spent, so the next admission (run 1 again) is not touched."""
    store = wired_world(sqlite_url, tmp_path, node_yaml("n1", 2) + "---\n" + job_yaml("first", "command: ['true']"))
    heartbeat(store, "n1", "elsewhere:1:0", time.time())
    admitter = Controller(store, node="not-n1")  # admits to n1; only n1's agent may start the run
    agent = Controller(store, node="n1")
    try:
        admitted = drive_until(admitter, "first", lambda s: s.get("phase") == "Starting", "admitted")
        assert drain(store, "n1", force=True).declared_lost == [("first", 1)]
        status = drive_until(agent, "first", lambda s: s.get("reason") == "Unschedulable", "back in line")
        assert status["phase"] == "Queued" and not status.get("runs") and not status.get("admission")
        assert status["eligibleAt"] == admitted["eligibleAt"]  # its old place in line
        assert not agent.agent.run_dir("first", _uid(store), 1).exists()  # nothing was spawned
        assert LOST_RUN not in _annotations(store, "first")
        events = [e for e in _events(store, "first") if e[0] == "NodeDrained"]
        assert len(events) == 2 and "had not started, so it goes back in line" in events[1][1]

        set_unschedulable(store, "n1", False)
        status = drive_until(agent, "first", lambda s: s.get("phase") == "Completed", "run on n1")
        assert [(r["number"], r["outcome"], r["node"]) for r in status["runs"]] == [(1, "Succeeded", "n1")]
    finally:
        admitter.agent.close()
        agent.agent.close()
        store.dispose()


def test_drain_force_on_a_node_no_agent_serves_is_proof_enough(sqlite_url, tmp_path):
    """A run on another node is that node's agent's to stop while the agent lives; once the
    node is NotReady, nobody can stop it and the operator's word alone makes it Lost (and an
    admission not started there goes back in line; a stop under way there ends as it would,
    its run Lost)."""
    text = "---\n".join(
        [
            node_yaml("n1", 2),
            node_yaml("n2", 2),
            job_yaml("ran", "command: [sleep, '300']\nplacement: {nodeName: n1}\nretry: {onLost: false}"),
            job_yaml("unstarted", "command: ['true']\nplacement: {nodeName: n2}"),
            job_yaml("cancelled", "shell: \"trap '' TERM; sleep 300\"\nplacement: {nodeName: n1}\nstopGracePeriod: 1h"),
        ]
    )
    store = wired_world(sqlite_url, tmp_path, text)
    heartbeat(store, "n2", "elsewhere:1:0", time.time())
    n1 = Controller(store, node="n1")  # n1's agent, which starts `ran` and then stops serving n1
    other = Controller(store, node="not-n1")
    heartbeat(store, "n1", n1.owner, time.time())
    pids = []
    try:
        for name in ("ran", "cancelled"):
            running = drive_until(n1, name, lambda s: s.get("phase") == "Running", "Running on n1")
            pids.append(running["runs"][0]["pid"])
        cancel(store, "cancelled")
        drive_until(n1, "cancelled", lambda s: s.get("phase") == "Stopping", "Stopping (SIGTERM is ignored)")
        drive_until(other, "unstarted", lambda s: s.get("phase") == "Starting", "admitted to n2")
        drain(store, "n1", force=True)
        drain(store, "n2", force=True)
        for name in ("ran", "unstarted", "cancelled"):  # both nodes are served: their agents' business
            other.jobs(name)
        phases = [_phase(store, name) for name in ("ran", "unstarted", "cancelled")]
        assert phases == ["Running", "Starting", "Stopping"]

        heartbeat(store, "n1", n1.owner, time.time() - STALE)
        heartbeat(store, "n2", "elsewhere:1:0", time.time() - STALE)
        status = drive_until(other, "ran", lambda s: s.get("phase") == "Completed", "Lost")
        assert (status["outcome"], status["reason"]) == ("Lost", "NodeLost")
        assert [(r["outcome"], r["reason"]) for r in status["runs"]] == [("Lost", "NodeLost")]
        status = drive_until(other, "unstarted", lambda s: s.get("reason") == "Unschedulable", "back in line")
        assert not status.get("runs") and not status.get("admission")
        status = drive_until(other, "cancelled", lambda s: s.get("phase") == "Completed", "Cancelled")
        assert (status["outcome"], status["message"]) == ("Cancelled", "cancelled by request")
        assert [(r["outcome"], r["reason"]) for r in status["runs"]] == [("Lost", "NodeLost")]
        assert runs_on(store, ["n1", "n2"]) == []
    finally:
        for pid in pids:  # the operator's word was a lie here: the test stops what it left
            os.killpg(pid, signal.SIGKILL)
        n1.agent.close()
        other.agent.close()
        store.dispose()


def _object(store, name: str):
    with store.read() as session:
        return repo.get(session, kind="Job", name=name)


def _uid(store, name: str = "first") -> str:
    return _object(store, name).uid


def _annotations(store, name: str) -> dict[str, str]:
    return _object(store, name).annotations


def _phase(store, name: str) -> str:
    return (_object(store, name).status or {}).get("phase")


def _events(store, name: str) -> list[tuple[str, str]]:
    with store.read() as session:
        return [(e.reason, e.message) for e in eventlog.newest(session, kind="Job", name=name)]


def test_a_node_whose_heartbeats_stop_is_said_not_ready_once_and_ready_when_back(store_url):
    """The Ready condition is derived when a node is read; the moments it changes are events
    (NodeNotReady once, by whichever controller looks first; NodeReady with the heartbeat
    that ends the silence), as Kubernetes' node controller records them."""
    from reconciler.api.node import READY_WINDOW
    from reconciler.controller.nodes import note_not_ready

    store = Store(store_url)
    try:
        beat = 1_800_000_000.0
        heartbeat(store, "quiet", "test:1:0", beat)
        assert note_not_ready(store, beat + READY_WINDOW / 2) == []  # still fresh
        assert note_not_ready(store, beat + READY_WINDOW + 1) == ["quiet"]
        assert note_not_ready(store, beat + READY_WINDOW + 60) == []  # said once
        with store.read() as session:
            events = [(e.reason, e.type) for e in eventlog.newest(session, kind="Node", name="quiet")]
            marked = repo.get(session, kind="Node", name="quiet")
        assert events[-1] == ("NodeNotReady", "Warning")
        assert marked is not None and marked.status["notReadySince"]
        heartbeat(store, "quiet", "test:1:0", beat + READY_WINDOW + 90)
        with store.read() as session:
            events = [e.reason for e in eventlog.newest(session, kind="Node", name="quiet")]
            back = repo.get(session, kind="Node", name="quiet")
        assert events[-1] == "NodeReady"
        assert back is not None and "notReadySince" not in back.status
        assert note_not_ready(store, beat + READY_WINDOW + 95) == []
    finally:
        store.dispose()


def test_a_controller_beats_often_enough_for_a_short_not_ready_window(monkeypatch, sqlite_url):
    """`serve --node-lost-after 3s`: its own node beats every 0.75 s (a quarter of the window),
    not every 10 s, so it stays Ready rather than flapping NotReady between two beats."""
    from reconciler.api import node as node_api
    from reconciler.controller import nodes

    assert nodes.heartbeat_interval() == min(10.0, node_api.READY_WINDOW / 4)
    monkeypatch.setattr(node_api, "READY_WINDOW", 3.0)
    assert nodes.heartbeat_interval() == 0.75
    store = Store(sqlite_url)
    controller = Controller(store).start()
    try:
        node = local_node_name()
        with store.read() as session:
            first = repo.get(session, kind="Node", name=node)
        assert first is not None

        def beat_again() -> bool:
            with store.read() as session:
                obj = repo.get(session, kind="Node", name=node)
            return obj is not None and obj.status["heartbeatAt"] != first.status["heartbeatAt"]

        wait_until(beat_again, timeout=5, message="a second heartbeat within a quarter of the 3 s window")
    finally:
        controller.stop()
