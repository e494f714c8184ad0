"""Remote agents across a real network of namespaces (issue 13 parts 3 and 4): placement over
three agents, pinning, round-robin, an agent's restart, node loss, a partition and its
healing with fencing, the token rules, and logs of a remote run through the server."""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections import defaultdict

import psutil

from tests.helpers import wait_until
from tests.integration.conftest import epoch
from tests.network.conftest import Net, job


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    live = most = 0
    for _, delta in points:
        live += delta
        most = max(most, live)
    return most


def test_a_dag_spreads_over_three_agents_and_no_node_exceeds_its_slots(net: Net):
    net.start_all()
    roots = [job(f"root-{i}", "sleep 0.4") for i in range(6)]
    middle = [
        job(f"mid-{i}", "sleep 0.3", dependsOn=[{"job": f"root-{i}"}, {"job": f"root-{(i + 1) % 6}"}]) for i in range(6)
    ]
    final = job("final", "echo done", dependsOn=[{"job": f"mid-{i}"} for i in range(6)])
    net.apply(*roots, *middle, final)
    names = [d["metadata"]["name"] for d in [*roots, *middle, final]]
    done = net.settled(*names)

    assert {n: s["outcome"] for n, s in done.items()} == dict.fromkeys(names, "Succeeded")
    per_node: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for status in done.values():
        (run,) = status["runs"]
        per_node[run["node"]].append((epoch(run["startedAt"]), epoch(run["finishedAt"])))
    assert set(per_node) == {"n1", "n2", "n3"}  # spread: every agent ran some
    for node, intervals in per_node.items():
        assert _max_overlap(intervals) <= 2, f"node {node} ran more than its 2 slots at once"
    for i in range(6):  # a dependent started after both its dependencies ended
        start = epoch(done[f"mid-{i}"]["runs"][0]["startedAt"])
        for dep in (f"root-{i}", f"root-{(i + 1) % 6}"):
            assert start >= epoch(done[dep]["runs"][0]["finishedAt"])
    # so did a run that ended before its agent recorded its start (psutil's start time, from
    # the boot time in whole seconds, had it start up to a second early)
    final_start = epoch(done["final"]["runs"][0]["startedAt"])
    assert all(final_start >= epoch(done[f"mid-{i}"]["runs"][0]["finishedAt"]) for i in range(6))


def test_pinning_and_round_robin_over_the_healthy_nodes(net: Net):
    net.start_all()
    net.kill_agent(net.agents[2])  # n3 stops posting heartbeats
    wait_until(lambda: "n3" not in net.ready_nodes(), timeout=20, interval=0.2, message="n3 NotReady")

    pinned = [job(f"pinned-{i}", "true", placement={"nodeName": "n2"}) for i in range(3)]
    net.apply(*pinned)
    done = net.settled(*(d["metadata"]["name"] for d in pinned))
    assert {s["runs"][0]["node"] for s in done.values()} == {"n2"}

    turns = []
    for i in range(4):  # one at a time, so each takes the next turn of the rotation
        net.apply(job(f"rr-{i}", "true", placement={"strategy": "round-robin"}))
        turns.append(net.settled(f"rr-{i}")[f"rr-{i}"]["runs"][0]["node"])
    assert set(turns) == {"n1", "n2"}  # n3 is not healthy: never chosen
    assert all(a != b for a, b in itertools.pairwise(turns)), turns  # alternating


def test_an_agent_killed_and_restarted_adopts_its_runs_and_keeps_their_exit_codes(net: Net):
    net.start_all()
    marker = net.tmp / "go"
    pinned = {"placement": {"nodeName": "n1"}}
    net.apply(
        job("ends-while-down", f"while [ ! -e {marker} ]; do sleep 0.05; done; exit 7", **pinned),
        job("ends-after-restart", f"while [ ! -e {marker}.2 ]; do sleep 0.05; done; exit 0", **pinned),
    )
    before = {name: net.running(name) for name in ("ends-while-down", "ends-after-restart")}
    agent = net.agents[0]
    net.kill_agent(agent)
    marker.touch()  # the first run ends while its agent is down
    wait_until(lambda: not psutil.pid_exists(before["ends-while-down"]["pid"]), timeout=20, message="run ended")
    net.start_agent(agent)
    wait_until(lambda: "adopted run" in agent.log.read_text(), timeout=20, interval=0.1, message="runs adopted")
    (net.tmp / "go.2").touch()
    done = net.settled("ends-while-down", "ends-after-restart")

    for name, code, outcome in (("ends-while-down", 7, "Failed"), ("ends-after-restart", 0, "Succeeded")):
        (run,) = done[name]["runs"]  # one run each: nothing started twice
        assert (run["exitCode"], run["outcome"], run["pid"]) == (code, outcome, before[name]["pid"])


def test_an_agent_killed_with_its_runs_reports_them_lost_and_they_run_again(net: Net):
    net.start_all()
    net.apply(
        job(
            "victim",
            '[ "$RECONCILER_RUN" = 1 ] && sleep 60; exit 0',
            placement={"nodeName": "n2"},
            retry={"limit": 1, "backoff": {"delay": "0s"}},
        )
    )
    first = net.running("victim")
    agent = net.agents[1]
    net.kill_agent(agent)
    os.killpg(first["pid"], signal.SIGKILL)  # the machine lost the run too: no exit record
    net.start_agent(agent)
    done = net.settled("victim")["victim"]

    lost, again = done["runs"]
    assert (lost["outcome"], lost["reason"]) == ("Lost", "NodeLost")
    assert (again["outcome"], again["number"], done["outcome"]) == ("Succeeded", 2, "Succeeded")


def test_a_run_on_a_lost_node_is_retried_elsewhere_after_lost_after(net: Net):
    net.start_all()
    for node in ("n1", "n2"):  # run 1 goes to n3; its retry may go anywhere healthy
        assert net.on_store("cordon", f"node/{node}").code == 0
    spec = {"retry": {"limit": 1, "lostAfter": "1s", "backoff": {"delay": "0s"}}}
    net.apply(job("far", '[ "$RECONCILER_RUN" = 1 ] && sleep 60; exit 0', **spec))
    first = net.running("far")
    for node in ("n1", "n2"):
        assert net.on_store("uncordon", f"node/{node}").code == 0
    net.kill_agent(net.agents[2])
    os.killpg(first["pid"], signal.SIGKILL)
    status = wait_until(
        lambda: (s := net.status("far")).get("phase") == "Completed" and s,
        timeout=60,
        interval=0.1,
        message="far completed",
    )
    lost, again = status["runs"]
    assert (lost["outcome"], lost["reason"], lost["node"]) == ("Lost", "NodeLost", "n3")
    assert again["node"] in ("n1", "n2") and again["outcome"] == "Succeeded"


def test_a_partition_past_lost_after_then_healed_stops_the_stale_run_and_one_success_counts(net: Net):
    net.start_all()
    marker = net.tmp / "successes"
    for node in ("n1", "n2"):  # run 1 goes to n3
        assert net.on_store("cordon", f"node/{node}").code == 0
    spec = {"retry": {"limit": 1, "lostAfter": "1s", "backoff": {"delay": "0s"}}, "stopGracePeriod": "1s"}
    net.apply(job("cut", f'[ "$RECONCILER_RUN" = 1 ] && sleep 60; echo "$RECONCILER_RUN" >> {marker}', **spec))
    first = net.running("cut")
    assert first["node"] == "n3"
    for node in ("n1", "n2"):
        assert net.on_store("uncordon", f"node/{node}").code == 0
    n3 = net.agents[2]
    net.link(n3, up=False)  # the wire is cut: n3 and its run live on, unheard
    done = net.settled("cut", timeout=60)["cut"]
    lost, again = done["runs"]
    assert (lost["outcome"], lost["reason"], again["outcome"]) == ("Lost", "NodeLost", "Succeeded")
    assert psutil.pid_exists(first["pid"])  # the stale run still runs on the far side

    net.link(n3, up=True)
    wait_until(lambda: not psutil.pid_exists(first["pid"]), timeout=30, interval=0.1, message="stale run stopped")
    assert "no longer current" in n3.log.read_text()  # its report was refused (409)
    assert marker.read_text().split() == ["2"]  # exactly one success: the retry's
    after = net.status("cut")
    assert [r["outcome"] for r in after["runs"]] == ["Lost", "Succeeded"] and after["outcome"] == "Succeeded"


def test_agent_tokens_touch_only_their_own_node(net: Net):
    net.start_all()
    a1, a2 = net.agents[0], net.agents[1]
    assert net.http(a1.ns, "GET", "/nodes/n1", a1.token)[0] == 200
    for method, path, body in (
        ("GET", "/nodes/n2", None),
        ("POST", "/nodes/n2/heartbeat", {"agent": "x:1:1", "address": "10.77.1.2"}),
        ("GET", "/nodes/n2/runs?timeoutSeconds=0", None),
        ("POST", "/nodes/n2/runs/any/report", {"uid": "u", "run": 1, "epoch": 1}),
        ("GET", "/jobs", None),
        ("POST", "/apply", {"items": []}),
    ):
        code, answer = net.http(a1.ns, method, path, a1.token, body)
        assert (code, answer["kind"], answer["reason"]) == (403, "Status", "Forbidden"), (method, path)
    code, answer = net.http(a2.ns, "GET", "/jobs", None)
    assert (code, answer["reason"]) == (401, "Unauthorized")
    code, answer = net.http(net.server_ns, "POST", "/nodes/n1/heartbeat", net.viewer, {"agent": "x", "address": "x"})
    assert code == 403  # a viewer only reads
    # its own node, an admission that is not current: refused as stale (a Kubernetes Status)
    code, answer = net.http(a1.ns, "POST", "/nodes/n1/runs/ghost/report", a1.token, {"uid": "u", "run": 1, "epoch": 9})
    assert (code, answer["kind"], answer["reason"]) == (409, "Status", "Conflict")
    assert "no longer current" in answer["message"]


def test_logs_of_a_remote_run_come_through_the_server(net: Net):
    net.start_all()
    net.apply(job("talker", "echo out-line; echo err-line >&2", placement={"nodeName": "n2"}))
    net.settled("talker")
    both = net.cli("logs", "job/talker")
    assert both.code == 0, both.stderr
    assert both.stdout.split() == ["out-line", "err-line"]
    errors = net.cli("logs", "job/talker", "--stream", "stderr")
    assert errors.stdout == "err-line\n"
    # from an agent's namespace with a viewer token: the server fetches it from n2's agent
    viewer = net.cli("logs", "job/talker", "--stream", "stdout", ns=net.agents[0].ns, token=net.viewer)
    assert viewer.stdout == "out-line\n", viewer.stderr


def test_agents_keep_working_through_a_restart_of_the_server(net: Net):
    net.start_all()
    gate = net.tmp / "gate"
    net.apply(job("outlives", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 5", placement={"nodeName": "n1"}))
    first = net.running("outlives")
    assert net.server is not None
    net.server.kill()  # kill -9: the agents lose their server
    net.server.wait(timeout=10)
    gate.touch()  # the run ends while nobody can hear of it
    wait_until(lambda: not psutil.pid_exists(first["pid"]), timeout=20, message="run ended")
    net.start_server()
    done = net.settled("outlives")["outlives"]
    (run,) = done["runs"]
    assert (run["exitCode"], run["outcome"], run["pid"]) == (5, "Failed", first["pid"])
    assert "again in" in net.agents[0].log.read_text()  # it reconnected with backoff


def test_a_service_on_a_lost_node_moves_to_another_node(net: Net):
    net.start_all()
    for node in ("n1", "n2"):  # its first run goes to n3
        assert net.on_store("cordon", f"node/{node}").code == 0
    net.apply(job("web", "sleep 600", type="service", retry={"lostAfter": "1s"}))
    first = net.running("web")
    assert first["node"] == "n3"
    for node in ("n1", "n2"):
        assert net.on_store("uncordon", f"node/{node}").code == 0
    net.kill_agent(net.agents[2])
    os.killpg(first["pid"], signal.SIGKILL)  # the machine is gone, and its run with it

    def moved() -> dict | None:
        status = net.status("web")
        runs = status.get("runs") or []
        live = runs[-1] if runs and not runs[-1].get("finishedAt") and status.get("phase") == "Running" else None
        return live if live is not None and live["node"] != "n3" else None

    again = wait_until(moved, timeout=60, interval=0.1, message="web running on another node")
    lost = net.status("web")["runs"][0]
    assert (lost["outcome"], lost["reason"], again["node"] in ("n1", "n2")) == ("Lost", "NodeLost", True)


def test_drain_force_of_a_live_agents_node_stops_its_run_and_records_it_lost(net: Net):
    net.start_all()
    net.apply(job("drained", '[ "$RECONCILER_RUN" = 1 ] && sleep 600; exit 0', placement={"nodeName": "n2"}))
    first = net.running("drained")
    drain = net.on_store("drain", "--force", "node/n2", "--timeout", "60s")
    assert drain.code == 0, drain.stderr
    wait_until(lambda: not psutil.pid_exists(first["pid"]), timeout=20, message="the agent stopped the run")
    status = net.settled("drained")["drained"]
    assert (status["runs"][0]["outcome"], status["runs"][0]["reason"]) == ("Lost", "NodeLost")


def test_an_unreachable_node_keeps_its_runs_slots_until_it_is_back(net: Net):
    net.start_all()
    gate = net.tmp / "gate"
    net.apply(job("patient", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 3", placement={"nodeName": "n1"}))
    first = net.running("patient")
    n1 = net.agents[0]
    net.link(n1, up=False)

    def unreachable() -> dict | None:
        status = net.status("patient")
        found = [c for c in status.get("conditions", []) if c["type"] == "NodeReachable"]
        return status if found and found[0]["status"] == "False" else None

    status = wait_until(unreachable, timeout=30, interval=0.1, message="NodeReachable=False")
    assert status["phase"] == "Running" and status.get("admission")  # its slot is kept: the run may live
    listing = net.cli("get", "nodes", "n1", "-o", "json")
    assert json.loads(listing.stdout)["status"]["allocated"]["slots"] == 1
    gate.touch()  # the run ends while the node is cut off
    wait_until(lambda: not psutil.pid_exists(first["pid"]), timeout=20, message="run ended")
    net.link(n1, up=True)
    done = net.settled("patient")["patient"]
    (run,) = done["runs"]  # its end, reported when the link healed, counts: the admission was still current
    assert (run["exitCode"], run["outcome"]) == (3, "Failed")
    reachable = [c for c in done["conditions"] if c["type"] == "NodeReachable"]
    assert reachable and reachable[0]["status"] == "True"


def test_a_remote_services_readiness_probe_runs_on_its_node_and_gates_the_registry(net: Net):
    net.start_all()
    flag = net.tmp / "ready"
    probe = {"command": ["test", "-e", str(flag)], "timeout": "2s"}
    net.apply(
        job(
            "api",
            "exec sleep 600",
            type="service",
            port=8080,
            placement={"nodeName": "n2"},
            readiness={"probe": probe, "interval": "200ms"},
        )
    )
    net.running("api")

    def registry() -> list[dict]:
        listed = net.cli("get", "services", "-o", "json")
        assert listed.code == 0, listed.stderr
        return json.loads(listed.stdout)["items"]

    wait_until(lambda: net.status("api").get("ready") is False, timeout=20, interval=0.1, message="not ready")
    assert registry() == []
    flag.touch()
    wait_until(lambda: net.status("api").get("ready") is True, timeout=20, interval=0.1, message="ready")
    (entry,) = registry()
    assert entry["metadata"]["name"] == "api"
    assert "10.77.2.2" in json.dumps(entry)  # reached at its node's address, as its agent reported it
    flag.unlink()
    wait_until(lambda: net.status("api").get("ready") is False, timeout=20, interval=0.1, message="not ready again")


def test_a_deleted_node_proves_its_runs_lost_and_its_returning_agent_stops_them(net: Net):
    net.start_all()
    net.apply(job("orphan", "sleep 600", placement={"nodeName": "n1"}))
    first = net.running("orphan")
    agent = net.agents[0]
    net.kill_agent(agent)  # its run lives on, unheard
    deleted = net.cli("delete", "node", "n1")
    assert deleted.code == 0, deleted.stderr
    status = net.settled("orphan")["orphan"]  # the operator's word: nothing runs there
    assert (status["runs"][0]["outcome"], status["runs"][0]["reason"]) == ("Lost", "NodeLost")
    assert psutil.pid_exists(first["pid"])
    net.start_agent(agent)  # registers n1 again; its report of the old run is refused, so it stops it
    wait_until(lambda: not psutil.pid_exists(first["pid"]), timeout=30, interval=0.1, message="stale run stopped")
    assert "no longer current" in agent.log.read_text()
