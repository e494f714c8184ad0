"""Service jobs (API.md 1.1, `type: service`): restarted in place after every exit with a
doubling delay, phase Running and reason CrashLoop while runs die young, never counted
against retry.limit; a readiness probe gating the service registry (`get services`); a
port held per node; delete, suspend and cancel stop it. Real controller, real processes,
real sockets on loopback."""

from __future__ import annotations

import json
import os
import socket
import sys

import psutil

from reconciler.api.meta import to_epoch
from tests.crash.harness import job
from tests.helpers import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def service(name: str, **spec) -> dict:
    manifest = job(name, "unused", type="service", stopGracePeriod="2s", **spec)
    if "command" in spec:
        del manifest["spec"]["shell"]
    return manifest


def registry(env) -> list[dict]:
    listed = json.loads(env.cli("get", "services", "-o", "json").stdout)
    keys = ("name", "node", "address", "port", "run", "ready")
    return [{k: item["status"][k] for k in keys} for item in listed["items"]]


def live_pid(status: dict, run: int) -> int:
    """The run's recorded pid: its wrapper, which waits for the command."""
    [record] = [r for r in status["runs"] if r["number"] == run]
    return record["pid"]


def kill_command(status: dict, run: int) -> None:
    """SIGKILL the service's own process (the wrapper's child), as a crash would."""
    children = psutil.Process(live_pid(status, run)).children(recursive=True)
    assert children, "the run's command is not running"
    for child in children:
        child.kill()


def test_a_killed_service_comes_back_on_its_node_and_the_registry_follows(env, controller):
    port = free_port()
    env.apply(service("web", command=http_server(port), port=port, retry={"limit": 0}))
    first = env.wait_running("web")
    wait_until(lambda: answers(port), 20, message="the service answers")
    node = first["nodeName"]
    assert registry(env) == [
        {"name": "web", "node": node, "address": "127.0.0.1", "port": port, "run": 1, "ready": True}
    ]
    admitted = env.admissions()
    assert [(a.job_name, a.port, a.run_number) for a in admitted] == [("web", port, 1)]

    kill_command(first, 1)
    second = env.wait_running("web", run=2)
    wait_until(lambda: answers(port), 20, message="the restarted service answers")
    assert (second["phase"] == "Running" and "outcome" not in second) or second["outcome"] is None
    assert second["restarts"] == 1, "restarts are counted, and never against retry.limit (0 here)"
    assert [r["outcome"] for r in second["runs"][:1]] == ["Failed"]
    assert second["runs"][1]["node"] == node, "a service restarts on its node"
    assert second["reason"] == "CrashLoop", "run 1 lived shorter than resetAfter (10m by default)"
    assert registry(env)[0]["run"] == 2
    # the admission was kept, not given up and taken again: same slots, the run number moved on
    assert [(a.job_name, a.run_number, a.admitted_at) for a in env.admissions()] == [
        ("web", 2, admitted[0].admitted_at)
    ]

    env.cli("delete", "job", "web")
    wait_until(lambda: env.obj("web") is None, 30, message="web deleted")
    assert not answers(port), "the service was deleted while its process still listens"
    assert registry(env) == [] and env.admissions() == []


def test_crash_loop_doubles_the_delay_then_a_healthy_run_resets_it(env, controller, tmp_path):
    count = tmp_path / "runs"
    # runs 1-3 die at once; run 4 lives past resetAfter, then dies; run 5 lives on
    script = (
        f"echo x >> {count}; n=$(wc -l < {count}); "
        'if [ "$n" -le 3 ]; then exit 3; fi; if [ "$n" -eq 4 ]; then sleep 1.5; exit 4; fi; exec sleep 600'
    )
    env.apply(job("flaky", script, type="service", restart={"delay": "200ms", "maxDelay": "500ms", "resetAfter": "1s"}))
    # between runs 1-3 (a window of 200-500 ms each: a poll may miss one, not all three)
    looping = env.wait_status("flaky", lambda s: s.get("restarts") in (1, 2, 3) and s.get("nextRunAt"))
    assert (looping["phase"], looping["reason"]) == ("Running", "CrashLoop")
    assert "admission" in looping, "a service between runs keeps its slots"

    final = env.wait_running("flaky", run=5, timeout=30)
    runs = {r["number"]: r for r in final["runs"]}
    assert [runs[n]["outcome"] for n in (1, 2, 3, 4)] == ["Failed"] * 4
    assert final["restarts"] == 4
    gaps = [to_epoch(runs[n + 1]["startedAt"]) - to_epoch(runs[n]["finishedAt"]) for n in (1, 2, 3, 4)]
    # doubling from 200ms, capped at 500ms; after run 4 (which lived 1.5s >= resetAfter) the delay is 200ms again
    for gap, delay in zip(gaps, (0.2, 0.4, 0.5, 0.2), strict=True):
        assert gap >= delay - 0.02, (gaps, "a restart came before its delay")
    assert gaps[3] < gaps[2] + 0.5 or gaps[3] < 1.0, gaps
    events = [(e.reason, e.message) for e in env.events("flaky")]
    reasons = [r for r, _ in events]
    assert reasons.count("BackOff") == 3 and reasons.count("RestartScheduled") == 1, events
    assert reasons.count("Restarting") == 4 and reasons.count("Started") == 5, events
    # run 4 started in CrashLoop, and left it once it had lived resetAfter, before it ended
    assert reasons.index("Recovered") < next(i for i, (r, m) in enumerate(events) if m.startswith("run 4 ended")), (
        events
    )
    assert final["reason"] == "Started", "run 4 lived resetAfter: run 5 is no crash loop"


def test_readiness_gates_the_registry(env, controller, tmp_path):
    flag = tmp_path / "ready"
    probe = {"command": ["test", "-e", str(flag)], "timeout": "2s"}
    env.apply(job("api", "exec sleep 600", type="service", readiness={"probe": probe, "interval": "200ms"}))
    env.wait_running("api")
    not_ready = env.wait_status("api", lambda s: s.get("ready") is False and s.get("conditions"))
    assert registry(env) == [], "a service whose probe has not passed is not in the registry"
    assert any(c["type"] == "Ready" and c["status"] == "False" for c in not_ready["conditions"])

    flag.touch()
    env.wait_status("api", lambda s: s.get("ready") is True)
    [entry] = registry(env)
    assert (entry["name"], entry["ready"], entry["run"]) == ("api", True, 1)
    assert "Ready:" in env.cli("describe", "job", "api").stdout

    flag.unlink()
    env.wait_status("api", lambda s: s.get("ready") is False)
    assert registry(env) == []
    assert env.status("api")["phase"] == "Running", "readiness gates the registry, it never restarts the run"


def test_one_port_per_node_and_a_port_in_use_is_not_given(env, controller):
    port = free_port()
    env.apply(service("first", command=http_server(port), port=port))
    env.wait_running("first")
    env.apply(service("second", command=http_server(port), port=port))
    waiting = env.wait_status("second", lambda s: s.get("reason") == "Unschedulable")
    assert waiting["phase"] == "Queued" and f"port {port} taken" in waiting["message"], waiting["message"]

    # the port goes with the first service; the second gets it then
    env.cli("delete", "job", "first")
    env.wait_running("second")
    assert [(a.job_name, a.port) for a in env.admissions()] == [("second", port)]
    env.cli("delete", "job", "second")
    wait_until(lambda: env.obj("second") is None, 30, message="second deleted")

    # a port some other process listens on is not given either, until it is let go
    outsider = socket.socket()
    outsider.bind(("127.0.0.1", port))
    outsider.listen()
    try:
        env.apply(service("third", command=http_server(port), port=port))
        blocked = env.wait_status("third", lambda s: s.get("reason") == "Unschedulable")
        assert f"port {port} taken" in blocked["message"]
    finally:
        outsider.close()
    env.wait_running("third", timeout=30)
    wait_until(lambda: answers(port), 20, message="third answers")


def test_suspend_stops_a_service_and_cancel_between_runs_ends_it(env, controller):
    env.apply(job("svc", "exec sleep 600", type="service", stopGracePeriod="1s"))
    running = env.wait_running("svc")
    pid = live_pid(running, 1)

    env.cli("suspend", "job/svc")
    env.wait_phase("svc", "Suspended")
    wait_until(lambda: not _alive(pid), 10, message="the suspended service's process is gone")
    assert env.admissions() == []
    env.cli("resume", "job/svc")
    env.wait_running("svc", run=2)

    # between runs (restart delay long): cancel ends it Cancelled and frees its slots
    env.apply(job("loop", "exit 1", type="service", restart={"delay": "1m"}))
    env.wait_status("loop", lambda s: s.get("restarts") == 1 and s.get("nextRunAt"))
    env.cli("cancel", "job/loop")
    done = env.wait_phase("loop", "Completed")
    assert (done["outcome"], done["reason"]) == ("Cancelled", "Cancelled")
    assert [a.job_name for a in env.admissions()] == ["svc"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie nobody reaped is not alive
        return stat.read().split()[2] != "Z"


def _ready(status: dict) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)


def test_a_probe_failing_from_the_start_says_why_and_ready_ends_with_the_run(env, controller, tmp_path):
    """Before its probe first passes, a failing probe's output is in the Ready condition
    (and a NotReady event), not 'no readiness probe has passed yet' for ever; between runs
    the condition is False: nothing is there to reach."""
    flag = tmp_path / "ready"
    probe = {"command": ["sh", "-c", f"test -e {flag} || {{ echo db connection refused; exit 1; }}"]}
    readiness = {"probe": probe, "interval": "200ms"}
    restart = {"delay": "30s", "maxDelay": "30s"}
    env.apply(
        job(
            "db",
            f"while [ ! -e {flag}.stop ]; do sleep 0.05; done",
            type="service",
            readiness=readiness,
            restart=restart,
        )
    )
    failing = env.wait_status("db", lambda s: (_ready(s) or {}).get("reason") == "ProbeFailed")
    assert "db connection refused" in _ready(failing)["message"] and failing["ready"] is False
    assert any(e.reason == "NotReady" and "db connection refused" in e.message for e in env.events("db"))

    flag.touch()
    env.wait_status("db", lambda s: s.get("ready") is True)
    (tmp_path / "ready.stop").touch()  # the run ends: the service waits 30s to restart
    between = env.wait_status("db", lambda s: s.get("nextRunAt") and s.get("restarts") == 1)
    assert (_ready(between)["status"], _ready(between)["reason"]) == ("False", "NotRunning"), between


def test_run_folders_go_with_their_records_and_with_their_job(env, controller):
    """A service restarting for ever keeps the records (and the folders, logs and all) of
    its last 20 runs, not of every run; a deleted job's folders go with it."""
    env.apply(job("churn", "exit 1", type="service", restart={"delay": "100ms", "maxDelay": "100ms"}))
    env.wait_status("churn", lambda s: s.get("restarts", 0) >= 24, timeout=60)
    env.cli("suspend", "job/churn")  # no more runs: what is kept can be compared
    status = env.wait_phase("churn", "Suspended")
    uid = env.obj("churn").uid
    kept = {r["number"] for r in status["runs"]}
    assert len(kept) == 20 and min(kept) > 1

    def folders() -> set[int]:
        runs = env.root / "state" / "runs"
        return {int(p.name.rsplit(".", 1)[1]) for p in runs.iterdir() if p.name.startswith(f"churn.{uid}.")}

    wait_until(lambda: folders() == kept, timeout=30, message=f"the folders of the kept runs only: {kept}")
    env.cli("delete", "job", "churn")
    wait_until(lambda: env.obj("churn") is None, timeout=30, message="deleted")
    wait_until(lambda: not folders(), timeout=30, message="its folders removed")


def test_a_running_job_deleted_takes_its_run_folder_with_it(env, controller):
    env.apply(job("long", "exec sleep 60"))
    env.wait_running("long")
    folder = env.run_dir("long", 1)
    assert folder.exists()
    env.cli("delete", "job", "long")
    wait_until(lambda: env.obj("long") is None, timeout=30, message="stopped and deleted")
    wait_until(lambda: not folder.exists(), timeout=30, message="its run folder removed")


def test_describe_service_shows_the_registry_entry_and_its_jobs_events(env, controller):
    port = free_port()
    env.apply(service("web", command=http_server(port), port=port))
    env.wait_running("web")
    wait_until(lambda: registry(env), timeout=30, message="in the registry")
    for ref in (("service", "web"), ("services/web",)):
        described = env.cli("describe", *ref).stdout
        assert "Kind:             Service" in described and f"port: {port}" in described, described
        assert "Started" in described[described.index("Events:") :]
    missing = env.cli("describe", "service", "nope", ok=False)
    assert missing.code == 3 and 'services "nope" not found' in missing.stderr
