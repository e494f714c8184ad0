"""The CLI through a server (`--server`): the verbs that follow (up, run --wait, wait, logs -f,
get -w), the ones that change several objects at once, what cannot go through a server, and
`serve --no-local-node`."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading

import psutil

from tests.helpers import run_cli, wait_until
from tests.server.conftest import settled, stop_server


def _write(path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def _job(name: str, command: str, extra: str = "") -> str:
    return f"""\
apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {{name: {name}, labels: {{suite: s}}}}
spec:
  shell: {command!r}
  stopGracePeriod: 2s
{textwrap.indent(textwrap.dedent(extra), "  ") + chr(10) if extra else ""}---
"""


def _phase(server, name: str) -> str | None:
    """The job's phase, None while it does not exist."""
    document = server.job(name)
    return document["status"].get("phase") if document.get("kind") == "Job" else None


def test_up_through_the_server_runs_to_completion_with_a_junit_report(server, tmp_path):
    folder = tmp_path / "pipe"
    folder.mkdir()
    _write(
        folder / "jobs.yaml", _job("first", "echo one") + _job("second", "echo two >&2; exit 4", "dependsOn: [first]")
    )
    report = tmp_path / "report.xml"
    result = server.cli("up", "-f", str(folder), "--junit", str(report), timeout=120)
    assert result.code == 1, result.stderr  # second failed
    assert "2 jobs: 1 Failed, 1 Succeeded" in result.stderr, result.stderr
    assert "job/second Failed" in result.stdout
    xml = report.read_text()
    assert 'name="second"' in xml and "two" in xml  # the stderr tail came through the API
    assert server.job("second")["status"]["runs"][0]["exitCode"] == 4


def test_up_through_the_server_stops_what_it_started_on_timeout_and_fail_fast(server, tmp_path):
    slow = _write(tmp_path / "slow.yaml", _job("sleepy", "sleep 60"))
    result = server.cli("up", "-f", slow, "--timeout", "2s", timeout=120)
    assert result.code == 1 and "timed out after 2s" in result.stderr, result.stderr
    status = server.job("sleepy")["status"]
    assert status["outcome"] == "Cancelled" and status["message"] == "cancelled by up: timed out after 2s"

    both = _write(tmp_path / "fast.yaml", _job("boom", "exit 1") + _job("long", "sleep 60"))
    result = server.cli("up", "-f", both, "--fail-fast", timeout=120)
    assert result.code == 1 and "job boom did not succeed (--fail-fast)" in result.stderr, result.stderr
    long = server.job("long")["status"]
    assert long["outcome"] == "Cancelled" and "up --fail-fast: job boom ended Failed" in long["message"]


def _started(server, *args: str) -> subprocess.Popen:
    """`reconciler ARGS` through the server, left running."""
    env = {**os.environ, "RECONCILER_STORE": server.store, "RECONCILER_SERVER": server.url}
    return subprocess.Popen(
        [sys.executable, "-m", "reconciler", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _lines(stream) -> queue.Queue:
    """The lines of a child's output, read in a thread (a test waits for them with a deadline)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def test_up_through_the_server_stops_what_it_started_on_ctrl_c(server, tmp_path):
    slow = _write(tmp_path / "slow.yaml", _job("held", "sleep 60"))
    up = _started(server, "up", "-f", slow)
    wait_until(lambda: _phase(server, "held") == "Running", timeout=30)
    up.send_signal(signal.SIGINT)
    _, err = up.communicate(timeout=60)
    assert up.returncode == 130, err
    status = server.job("held")["status"]
    assert status["outcome"] == "Cancelled" and status["message"] == "cancelled by up: interrupted"


def test_run_wait_logs_follow_and_wait_through_the_server(server, tmp_path):
    failing = server.cli("run", "--wait", "--", "sh", "-c", "echo out; exit 3")
    assert failing.code == 1 and "job.reconciler.dev/job-1 created" in failing.stdout
    assert server.cli("logs", "job/job-1").stdout == "out\n"

    gate = tmp_path / "gate"
    script = f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done; echo finished"
    assert server.cli("run", "--name", "gated", "--", "sh", "-c", script).code == 0
    wait_until(lambda: _phase(server, "gated") == "Running", timeout=30)
    follow = _started(server, "logs", "-f", "job/gated")
    assert follow.stdout is not None
    assert follow.stdout.readline() == "started\n"  # while the run is alive
    assert server.job("gated")["status"]["phase"] == "Running"
    gate.touch()
    rest, err = follow.communicate(timeout=30)
    assert follow.returncode == 0 and rest == "finished\n", err

    waited = server.cli("wait", "job/gated", "--for", "condition=Succeeded", "--timeout", "30s")
    assert waited.code == 0 and waited.stdout == "job.reconciler.dev/gated condition met\n"
    never = server.cli("wait", "job/job-1", "--for", "condition=Succeeded", "--timeout", "30s")
    assert never.code == 1 and "can no longer be Succeeded" in never.stderr
    assert server.cli("run", "--name", "late", "--", "sleep", "30").code == 0
    timed = server.cli("wait", "job/late", "--for", "condition=Completed", "--timeout", "1s")
    assert timed.code == 1 and "timed out waiting for condition Completed on late" in timed.stderr
    assert server.cli("cancel", "job/late").code == 0


def test_get_watch_through_the_server_prints_each_change(server, tmp_path):
    gate = tmp_path / "gate"
    watcher = _started(server, "get", "jobs", "-w")
    try:
        assert watcher.stdout is not None and watcher.stderr is not None
        assert watcher.stderr.readline() == "No resources found.\n"  # listed: now it watches
        script = f"while [ ! -e {gate} ]; do sleep 0.05; done"
        assert server.cli("run", "--name", "watched", "--", "sh", "-c", script).code == 0
        wait_until(lambda: _phase(server, "watched") == "Running", timeout=30)
        gate.touch()  # its end is a change the watch must print
        lines = _lines(watcher.stdout)
        seen: list[str] = []
        wait_until(
            lambda: "Succeeded" in (seen.append(lines.get(timeout=30)) or seen[-1]), timeout=30, message="Succeeded row"
        )
        assert all(line.startswith("watched ") for line in seen), seen
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.communicate(timeout=30)


def test_a_change_made_after_the_listing_through_the_server_is_not_lost(server):
    """`get -w --server` prints the listing its watch stream starts from (the list's
    resourceVersion), so a write made after that list was read, before the stream opened,
    still comes as a change; as a pool's derived usage does after its own listing."""
    from reconciler.client.remote import RemoteClient
    from tests.server.conftest import PREFIX, job_manifest

    def apply(**labels: str) -> None:
        answer = server.http().post(f"{PREFIX}/apply", json={"items": [job_manifest("w", suspend=True, labels=labels)]})
        assert answer.status_code == 200, answer.text

    apply()
    client = RemoteClient(server.url, None)
    try:
        listing, changes = client.watch("jobs", [], None)
        assert [o.name for o in listing.objects] == ["w"] and listing.missing == []
        apply(k="v")  # before the stream is opened
        told: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: told.put(next(changes)), daemon=True).start()
        event, obj = told.get(timeout=30)
        assert (event, obj.name, obj.labels.get("k")) == ("MODIFIED", "w", "v")
        missing, _ = client.watch("jobs", ["w", "nothing"], None)
        assert [o.name for o in missing.objects] == ["w"] and missing.missing == ["nothing"]
    finally:
        client.close()


def test_wait_through_a_server_that_goes_away_names_the_server(serve, sqlite_url):
    """A wait whose time runs out while the server cannot be reached says so (exit 1), as get
    -w and logs -f do, not that the condition was not met."""
    server = serve(sqlite_url)
    assert server.cli("run", "--name", "long", "--", "sleep", "60").code == 0
    wait_until(lambda: _phase(server, "long") == "Running", timeout=30)
    waiting = _started(server, "wait", "job/long", "--for", "condition=Completed", "--timeout", "15s")
    port = int(server.url.rsplit(":", 1)[1])

    def watching() -> bool:  # its watch stream is open: the wait is under way
        conns = psutil.Process(waiting.pid).net_connections(kind="tcp")
        return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED for c in conns)

    wait_until(watching, timeout=30, message="the wait's watch stream")
    stop_server(server)
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, err
    assert f"cannot reach the server at {server.url}" in err and "timed out waiting" not in err, err


def test_a_server_url_with_a_path_is_said_to_be_wrong_not_an_object_not_found(server):
    """--server URL/apis names no route: exit 1 saying so, not "not found" (exit 3) as if an
    object were missing."""
    from tests.helpers import run_cli

    wrong = run_cli("get", "jobs", store=server.store, env={"RECONCILER_SERVER": server.url + "/apis"})
    assert wrong.code == 1, wrong
    assert "has no such route" in wrong.stderr and "its root" in wrong.stderr, wrong.stderr
    missing = server.cli("get", "job", "nope")
    assert missing.code == 3 and 'jobs "nope" not found' in missing.stderr  # a real 404 of an object


def test_get_events_watch_through_the_server_prints_new_events(server, tmp_path):
    watcher = _started(server, "get", "events", "-w", "-o", "name")
    try:
        assert watcher.stdout is not None
        lines = _lines(watcher.stdout)
        assert server.cli("run", "--name", "noted", "--", "true").code == 0
        seen: list[str] = []
        wait_until(
            lambda: (seen.append(lines.get(timeout=30)) or seen[-1]).startswith("event/noted."),
            timeout=30,
            message="the new job's event",
        )
        assert watcher.poll() is None
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.communicate(timeout=30)


def test_get_watch_of_pools_through_the_server_prints_usage_as_it_changes(server, tmp_path):
    """A pool's USED is derived by the server when it answers; a watch stream carries only
    writes, so the client lists such kinds again on a timer and prints what changed."""
    gate = tmp_path / "gate"
    script = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    pool = _write(
        tmp_path / "pool.yaml",
        "apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: lane}\nspec: {slots: 1}\n",
    )
    assert server.cli("apply", "-f", pool).code == 0
    watcher = _started(server, "get", "pools", "lane", "-w")
    try:
        assert watcher.stdout is not None
        lines = _lines(watcher.stdout)
        assert lines.get(timeout=30).split()[:3] == ["NAME", "SLOTS", "USED"]
        assert lines.get(timeout=30).split()[:3] == ["lane", "1", "0"]
        assert server.cli("run", "--name", "held", "--pool", "lane", "--", "sh", "-c", script).code == 0
        assert lines.get(timeout=30).split()[:3] == ["lane", "1", "1"]
        gate.touch()
        assert lines.get(timeout=30).split()[:3] == ["lane", "1", "0"]
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.communicate(timeout=30)


def test_cordon_uncordon_and_drain_through_the_server(server, tmp_path):
    """Node maintenance acts through the API like every verb: on the server's store, not on
    a local one (the CLI's environment names a store that the server does not use)."""
    from reconciler.controller.nodes import local_node_name

    node = local_node_name()
    gate = tmp_path / "gate"
    elsewhere = {"RECONCILER_STORE": f"sqlite:///{tmp_path / 'elsewhere.db'}"}  # what a wrong path would act on

    def cli(*args: str):
        return server.cli(*args, env=elsewhere)

    cordoned = cli("cordon", f"node/{node}")
    assert cordoned.code == 0 and cordoned.stdout == f"node.reconciler.dev/{node} cordoned\n", cordoned
    script = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    assert server.cli("run", "--name", "held", "--", "sh", "-c", script).code == 0
    wait_until(lambda: server.job("held")["status"].get("reason") == "Unschedulable", timeout=30)
    assert cli("uncordon", f"node/{node}").stdout == f"node.reconciler.dev/{node} uncordoned\n"
    wait_until(lambda: _phase(server, "held") == "Running", timeout=30)
    drained = cli("drain", "--force", f"node/{node}", "--timeout", "60s")
    assert drained.code == 0, drained
    assert drained.stdout == f"node.reconciler.dev/{node} cordoned\nnode.reconciler.dev/{node} drained\n"
    assert f"job/held run 1 on node/{node}: declared lost" in drained.stderr
    status = server.job("held")["status"]
    assert status["runs"][-1]["outcome"] == "Lost" and status["runs"][-1]["reason"] == "NodeLost", status
    assert cli("uncordon", f"node/{node}").code == 0


def test_several_objects_at_once_through_the_server(server, tmp_path):
    pipeline = _write(
        tmp_path / "p.yaml",
        "apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: lane}\nspec: {slots: 1}\n---\n"
        + _job("ok", "true", "pool: lane")
        + _job("bad", "exit 2", "pool: lane"),
    )
    assert server.cli("apply", "-f", pipeline).code == 0
    settled(server, "ok", "bad")
    rerun = server.cli("rerun", "--failed", "-l", "suite=s")
    assert rerun.code == 0 and rerun.stdout == "job.reconciler.dev/bad rerun requested\n"
    wait_until(lambda: server.job("bad")["status"].get("revision") == 2, timeout=30)
    settled(server, "bad")
    suspended = server.cli("suspend", "-l", "suite=s")
    assert suspended.stdout == "job.reconciler.dev/bad suspended\njob.reconciler.dev/ok suspended\n"
    deleted = server.cli("delete", "-f", pipeline)  # jobs before their pool, in one transaction
    assert deleted.code == 0, deleted.stderr
    assert deleted.stdout.splitlines() == [
        "job.reconciler.dev/ok deleted",
        "job.reconciler.dev/bad deleted",
        "pool.reconciler.dev/lane deleted",
    ]


def test_what_cannot_go_through_a_server_is_refused(server):
    controller = server.cli("controller")
    assert controller.code == 2 and "cannot go through --server" in controller.stderr
    serving = server.cli("serve", "--port", "1")
    assert serving.code == 2 and "cannot go through --server" in serving.stderr
    token = run_cli("--token", "t" * 20, "get", "jobs", store=server.store)
    assert token.code == 2 and "--token is for a server" in token.stderr
    # the token in the environment alone is ignored locally (it is for a server)
    assert run_cli("get", "jobs", store=server.store, env={"RECONCILER_TOKEN": "t" * 20}).code == 0


def test_serve_without_a_local_node_leaves_jobs_unschedulable(serve, sqlite_url):
    server = serve(sqlite_url, "--no-local-node")
    assert server.cli("run", "--name", "stranded", "--", "true").code == 0
    status = wait_until(
        lambda: (s := server.job("stranded").get("status", {})).get("reason") == "Unschedulable" and s,
        timeout=30,
        message="no node to place it on",
    )
    assert status["phase"] == "Queued" and "0/0 nodes" in status["message"], status
    nodes = server.cli("get", "nodes")
    assert nodes.stdout == "" and "No resources found." in nodes.stderr
    assert "no local node" in server.log.read_text()


def test_get_services_watch_through_the_server_shows_a_service_leaving_the_registry(server, tmp_path):
    """A client following the registry must learn that a service is gone (its job deleted),
    not keep an endpoint that no longer answers."""
    manifest = _write(tmp_path / "svc.yaml", _job("web", "exec sleep 60", "type: service"))
    assert server.cli("apply", "-f", manifest).code == 0
    wait_until(lambda: "web" in server.cli("get", "services").stdout, timeout=30, message="in the registry")
    watcher = _started(server, "get", "services", "-w", "--output-watch-events", "-o", "name")
    try:
        assert watcher.stdout is not None
        lines = _lines(watcher.stdout)
        assert lines.get(timeout=30).strip().endswith("/web")  # the listing
        assert server.cli("delete", "job", "web").code == 0
        gone = lines.get(timeout=30).split()
        assert gone[0] == "DELETED" and gone[1].endswith("/web"), gone
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.communicate(timeout=30)
