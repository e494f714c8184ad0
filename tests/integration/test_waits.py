"""waitFor: until, delay, path (file vs dir), probe (incl. fatalOnError), mode any,
abortAfter; diagnostics in status.waits and `describe`; waits gate the first run only."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

from .conftest import STAMP, docs, epoch, job_yaml


def _first_start(job: dict) -> float:
    return epoch(job["status"]["runs"][0]["startedAt"])


def test_wait_conditions(env):
    root = env.root
    ready, flag, never = root / "ready", root / "probe-flag", root / "never"
    until = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    manifest = env.write(
        "waits.yaml",
        docs(
            job_yaml("w-until", f"command: ['true']\nwaitFor: {{conditions: [{{until: '{until}'}}]}}"),
            job_yaml("w-delay", "command: ['true']\nwaitFor: {conditions: [{delay: 1s}]}"),
            job_yaml(
                "w-file",
                f"command: ['true']\nwaitFor: {{conditions: [{{path: '{ready}', type: file, interval: 100ms}}]}}",
            ),
            job_yaml(
                "w-dir",
                f"command: ['true']\nwaitFor: {{conditions: [{{path: '{ready}', type: dir, interval: 100ms}}]}}",
            ),
            job_yaml(
                "w-probe",
                "command: ['true']\n"
                f"waitFor: {{conditions: [{{probe: {{command: [test, -e, '{flag}'], interval: 100ms}}}}]}}",
            ),
            job_yaml(
                "w-fatal",
                "command: ['true']\n"
                "waitFor: {conditions: [{probe: {command: [sh, -c, 'echo not ready; exit 2'], fatalOnError: true}}]}",
            ),
            job_yaml(
                "w-any",
                "command: ['true']\n"
                f"waitFor: {{mode: any, conditions: [{{path: '{never}', interval: 100ms}}, {{delay: 500ms}}]}}",
            ),
            job_yaml(
                "w-abort",
                f"command: ['true']\nwaitFor: {{abortAfter: 1s, conditions: [{{path: '{never}', interval: 100ms}}]}}",
            ),
        ),
    )
    env.controller()
    env.ok("apply", "-f", str(manifest))

    # each condition is evaluated and explained while the jobs wait
    env.wait_status(
        "w-file", lambda s: s.get("waits") and s["waits"][0]["message"] == f"{ready} is not a file", what="file wait"
    )
    env.wait_status(
        "w-dir", lambda s: s.get("waits") and s["waits"][0]["message"] == f"{ready} is not a directory", what="dir wait"
    )
    env.wait_status(
        "w-probe", lambda s: s.get("waits") and s["waits"][0]["message"].startswith("probe exited 1"), what="probe wait"
    )
    waiting = env.status("w-file")
    assert waiting["phase"] == "Waiting" and waiting["reason"] == "WaitingForConditions"
    (wait,) = waiting["waits"]
    assert wait["type"] == "path" and wait["satisfied"] is False and epoch(wait["lastCheckedAt"]) > 0
    described = env.ok("describe", "job", "w-probe").stdout
    waits_section = described.split("Waits:")[1].split("Runs:")[0]
    assert "probe" in waits_section and "no" in waits_section and "probe exited 1" in waits_section

    # a directory satisfies `type: dir` only: w-dir runs, w-file keeps waiting
    made_dir = time.time()
    ready.mkdir()
    env.wait_phase("w-dir", "Completed")
    still = env.status("w-file")
    assert (
        still["phase"] == "Waiting"
        and not still.get("runs")
        and still["waits"][0]["message"] == f"{ready} is not a file"
    )

    # now a file: w-file runs; the probe starts succeeding: w-probe runs
    ready.rmdir()
    made_file = time.time()
    ready.write_text("go\n")
    flag.touch()
    env.wait_completed()
    jobs = env.jobs()
    outcome = {n: (j["status"]["outcome"], j["status"]["reason"]) for n, j in jobs.items()}
    assert outcome == {
        "w-until": ("Succeeded", "Succeeded"),
        "w-delay": ("Succeeded", "Succeeded"),
        "w-file": ("Succeeded", "Succeeded"),
        "w-dir": ("Succeeded", "Succeeded"),
        "w-probe": ("Succeeded", "Succeeded"),
        "w-any": ("Succeeded", "Succeeded"),
        "w-fatal": ("Aborted", "WaitProbeFailed"),
        "w-abort": ("Aborted", "WaitAbortDeadline"),
    }

    def accepted(name: str) -> float:
        return epoch(jobs[name]["status"]["acceptedAt"])

    assert _first_start(jobs["w-until"]) >= epoch(until) - STAMP
    assert _first_start(jobs["w-delay"]) >= accepted("w-delay") + 1.0 - STAMP
    assert _first_start(jobs["w-dir"]) >= made_dir - STAMP
    assert _first_start(jobs["w-file"]) >= made_file - STAMP
    assert _first_start(jobs["w-probe"]) >= made_file - STAMP
    # mode any: the delay alone opened it, the path never existed
    assert _first_start(jobs["w-any"]) >= accepted("w-any") + 0.5 - STAMP
    assert [(w["type"], w["satisfied"]) for w in jobs["w-any"]["status"]["waits"]] == [("path", False), ("delay", True)]
    # the aborted ones never started anything
    for name in ("w-fatal", "w-abort"):
        assert not jobs[name]["status"].get("runs"), name
        assert not env.run_dir(name, 1).exists()
    assert "not ready" in jobs["w-fatal"]["status"]["message"]
    assert epoch(jobs["w-abort"]["status"]["completionTime"]) >= accepted("w-abort") + 1.0 - STAMP
    # it names the condition that was not met, as status.waits says it
    assert jobs["w-abort"]["status"]["message"] == f"past the wait abort deadline: {never} does not exist"
    # the last evaluation of each condition stays on record
    assert [(w["type"], w["satisfied"]) for w in jobs["w-probe"]["status"]["waits"]] == [("probe", True)]
    assert all(w.get("message") and w.get("lastCheckedAt") for j in jobs.values() for w in j["status"].get("waits", []))


def test_waits_gate_only_the_first_run(env):
    gate, marker = env.root / "gate", env.root / "attempted"
    gate.touch()
    # run 1 consumes the gate file and fails; the retry must not wait for the gate again
    manifest = env.write(
        "gated.yaml",
        job_yaml(
            "gated",
            f"""
        shell: "if [ -e '{marker}' ]; then echo second; exit 0; fi; touch '{marker}'; rm '{gate}'; exit 1"
        waitFor: {{conditions: [{{path: '{gate}', interval: 100ms}}]}}
        retry: {{limit: 1, backoff: {{delay: 100ms}}}}
    """,
        ),
    )
    result = env.up(manifest, timeout="30s")
    assert result.code == 0, result.stderr
    status = env.get_job("gated")["status"]
    assert [(r["number"], r["exitCode"]) for r in status["runs"]] == [(1, 1), (2, 0)]
    assert not gate.exists()
    assert env.ok("logs", "job/gated").stdout == "second\n"


def test_the_wait_abort_deadline_bounds_the_wait_for_dependencies_and_says_so(env):
    """abortAfter bounds the whole of Waiting: a job whose conditions are met but whose
    dependency has not completed by then is Aborted, and its message names the dependency,
    not conditions that were met."""
    gate = env.root / "gate"
    manifest = env.write(
        "late.yaml",
        docs(
            job_yaml("slow", f"shell: 'while [ ! -e {gate} ]; do sleep 0.05; done'"),
            job_yaml(
                "after-slow",
                "command: ['true']\ndependsOn: [slow]\nwaitFor: {conditions: [{delay: 100ms}], abortAfter: 1s}",
            ),
        ),
    )
    env.ok("apply", "-f", manifest)
    env.controller()
    done = env.wait_phase("after-slow", "Completed")
    gate.touch()  # slow ends too
    env.wait_phase("slow", "Completed")
    assert (done["outcome"], done["reason"]) == ("Aborted", "WaitAbortDeadline"), done
    assert done["message"] == "past the wait abort deadline: waiting for slow (dependencies)", done
    assert [(w["type"], w["satisfied"]) for w in done["waits"]] == [("delay", True)]


def test_a_slow_probe_holds_up_no_other_job(env):
    """Probes run beside the reconcile loop (agent/probe.Probes), not in it: with the
    controller's one reconcile worker, a probe that takes long must not stop other jobs."""
    gate = env.root / "gate"
    os.mkfifo(gate)
    manifest = env.write(
        "slow.yaml",
        docs(
            job_yaml(
                "w-slow",
                f"command: ['true']\nwaitFor: {{conditions: [{{probe: {{command: [sh, -c, 'read x < {gate}'], "
                "timeout: 60s}}]}",
            ),
            job_yaml("other", "command: ['true']"),
        ),
    )
    env.controller()
    env.ok("apply", "-f", str(manifest))
    try:
        env.wait_phase("other", "Completed")
        slow = env.status("w-slow")
        assert slow["phase"] == "Waiting" and slow["waits"][0]["message"] == "probe running", slow
        gate.write_text("go\n")
        env.wait_phase("w-slow", "Completed")
        assert env.status("w-slow")["outcome"] == "Succeeded"
    finally:
        try:  # never leave the probe blocked on its fifo
            fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"go\n")
            os.close(fd)
        except OSError:
            pass


def test_a_watched_paths_last_check_moves_on(sqlite_url, tmp_path, monkeypatch):
    """The path watcher checks a missing path every interval without writing the job; its
    "last checked" froze at the first check. Readers now show when the watcher last checked
    every path (its node's heartbeat records it)."""
    from pathlib import Path

    from reconciler.api.meta import to_epoch
    from reconciler.apply import apply_manifests
    from reconciler.controller import manager, nodes
    from reconciler.manifests import parse_text
    from reconciler.reads import describe
    from reconciler.store import Store
    from reconciler.store import repository as repo
    from tests.helpers import wait_until

    monkeypatch.setattr(nodes, "HEARTBEAT_INTERVAL", 0.2)
    store = Store(sqlite_url)
    text = job_yaml(
        "waits", f"command: ['true']\nwaitFor: {{conditions: [{{path: '{tmp_path / 'never'}', interval: 100ms}}]}}"
    )
    manifests, problems = parse_text(text, "w.yaml", Path(tmp_path))
    assert not problems
    apply_manifests(store, manifests)
    controller = manager.Controller(store).start()
    try:

        def last_checked() -> float | None:
            obj, _ = describe(store, "job", "waits")
            checks = [w for w in (obj.status or {}).get("waits", []) if w.get("lastCheckedAt")]
            return to_epoch(checks[0]["lastCheckedAt"]) if checks else None

        first = wait_until(last_checked, message="a first check recorded")
        wait_until(lambda: (last_checked() or 0) > first + 0.5, timeout=15, message="the last check moved on")
        with store.read() as session:
            stored = repo.get(session, kind="Job", name="waits")
        assert to_epoch(stored.status["waits"][0]["lastCheckedAt"]) <= first + 0.5  # derived, not written per check
    finally:
        controller.stop()
        store.dispose()
