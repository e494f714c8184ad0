"""`up`, the CI verb (issue 10): on a timeout, Ctrl-C or SIGTERM, and with --fail-fast once a
job fails, it stops what it started, says so, and leaves no process behind; --junit writes
a report the common CI report viewers read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
from junitparser import Failure, JUnitXml

from tests.helpers import wait_until

from .conftest import job_yaml

LONG = "sleep 300"


def runs_alive(env) -> list[int]:
    """Pids of run wrappers of this test that are alive."""
    alive = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if len(cmd) > 4 and cmd[3] == "reconciler-run" and cmd[4].startswith(str(env.root)):
            alive.append(proc.info["pid"])
    return alive


def test_up_timeout_stops_what_it_started(env):
    """It used to exit and leave the job's process running."""
    path = env.write("jobs.yaml", job_yaml("long", f"shell: {LONG}\nstopGracePeriod: 1s"))
    result = env.cli("up", "-f", str(path), "--timeout", "2s", timeout=120)
    assert result.code == 1, result
    assert "error: timed out after 2s" in result.stderr
    assert "stopped 1 job(s) it started: long" in result.stderr
    status = env.status("long")
    assert (status["phase"], status["outcome"]) == ("Completed", "Cancelled"), status
    assert status["message"] == "cancelled by up: timed out after 2s"
    assert runs_alive(env) == []


def test_up_timeout_leaves_a_job_it_found_running_and_did_not_change(env):
    """What `up` stops is what it started: a job another controller was running before, which
    its apply left unchanged, is followed but not cancelled (it was, 'cancelled by up')."""
    env.controller()
    path = env.write("jobs.yaml", job_yaml("already", f"shell: {LONG}\nstopGracePeriod: 1s"))
    env.apply("jobs.yaml", path.read_text())
    env.wait_phase("already", "Running")
    result = env.cli("up", "-f", str(path), "--timeout", "1s", timeout=120)
    assert result.code == 1 and "error: timed out after 1s" in result.stderr, result
    assert "stopped" not in result.stderr
    status = env.status("already")
    assert status["phase"] == "Running" and not status.get("outcome"), status
    env.cli("cancel", "job/already")
    env.wait_phase("already", "Completed")


def test_up_fail_fast_cancels_the_rest_and_says_by_what(env):
    path = env.write(
        "jobs.yaml",
        job_yaml("bad", "shell: sleep 0.5; exit 3")
        + "---\n"
        + job_yaml("long", f"shell: {LONG}\nstopGracePeriod: 1s")
        + "---\n"
        + job_yaml("after-long", "command: ['true']\ndependsOn: [long]"),
    )
    result = env.cli("up", "-f", str(path), "--fail-fast", "--timeout", "60s", timeout=120)
    assert result.code == 1, result
    assert "job bad did not succeed (--fail-fast)" in result.stderr
    jobs = {name: env.status(name) for name in ("bad", "long", "after-long")}
    assert jobs["bad"]["outcome"] == "Failed"
    for name in ("long", "after-long"):
        assert jobs[name]["outcome"] == "Cancelled", jobs[name]
        assert jobs[name]["message"] == "cancelled by up --fail-fast: job bad ended Failed"
    assert runs_alive(env) == []


def test_ctrl_c_stops_what_it_started(env):
    path = env.write("jobs.yaml", job_yaml("long", f"shell: {LONG}\nstopGracePeriod: 1s"))
    up = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "up", "-f", str(path)],
        env={**os.environ, "RECONCILER_STORE": env.url},
        cwd=env.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        env.wait_phase("long", "Running")
        up.send_signal(signal.SIGINT)
        _, stderr = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, stderr
    assert "stopped 1 job(s) it started: long" in stderr
    assert env.status("long")["message"] == "cancelled by up: interrupted"
    wait_until(lambda: runs_alive(env) == [], timeout=10, message="no run left")


def test_ctrl_c_right_after_the_apply_still_stops_what_it_applied(env):
    """The press lands as soon as up has written the job (it says `created`), while it is
    still starting to follow: the job is cancelled all the same, not left to run."""
    path = env.write("jobs.yaml", job_yaml("early", f"shell: {LONG}\nstopGracePeriod: 1s"))
    up = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "up", "-f", str(path)],
        env={**os.environ, "RECONCILER_STORE": env.url},
        cwd=env.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert up.stderr is not None
        assert up.stderr.readline() == "job.reconciler.dev/early created\n"
        up.send_signal(signal.SIGINT)
        _, stderr = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, stderr
    status = env.status("early")
    assert status["outcome"] == "Cancelled" and status["message"] == "cancelled by up: interrupted", status
    wait_until(lambda: runs_alive(env) == [], timeout=10, message="no run left")


def test_junit_report_has_a_testcase_per_job_and_failures_with_their_why(env):
    path = env.write(
        "jobs.yaml",
        job_yaml("ok", "shell: sleep 0.2")
        + "---\n"
        # a colour code on stderr (ESC cannot be in XML 1.0: written raw, no viewer parsed the file)
        + job_yaml("bad", "shell: printf '\\033[31mred\\033[0m\\n' >&2; echo the reason it failed >&2; exit 3")
        + "---\n"
        + job_yaml("after-bad", "command: ['true']\ndependsOn: [bad]"),
    )
    report = env.root / "report.xml"
    nowhere = env.cli("up", "-f", str(path), "--junit", str(env.root / "no" / "such" / "r.xml"), timeout=120)
    assert nowhere.code == 2 and "--junit" in nowhere.stderr and "Traceback" not in nowhere.stderr, nowhere
    assert env.cli("get", "jobs", "-o", "name").stdout == ""  # refused before anything was applied
    result = env.cli("up", "-f", str(path), "--junit", str(report), timeout=120)
    assert result.code == 1 and f"wrote {report}" in result.stderr, result
    suites = list(JUnitXml.fromfile(str(report)))
    assert len(suites) == 1
    (suite,) = suites
    assert (suite.tests, suite.failures) == (3, 2)
    cases = {case.name: case for case in suite}
    assert set(cases) == {"ok", "bad", "after-bad"}
    # the run's time: from its start to its exit record's mtime; the C wrapper stamps it when
    # the command ended, the sh one (runs started while the C one is built) leaves the kernel's
    # coarse stamp, up to a tick early (4 ms at HZ=250): a `sleep 0.2` may read 0.199 there
    assert cases["ok"].is_passed and cases["ok"].time >= 0.19
    (failure,) = [r for r in cases["bad"].result if isinstance(r, Failure)]
    assert failure.type == "Failed"
    assert failure.message.startswith("Failed, BackoffLimitExceeded, exit code 3 (run 1)")
    assert "the reason it failed" in (failure.text or "")
    assert "\\x1b[31mred\\x1b[0m" in (failure.text or "")
    (aborted,) = [r for r in cases["after-bad"].result if isinstance(r, Failure)]
    assert aborted.type == "Aborted" and "DependencyUnsatisfied" in aborted.message


_UP_IN_A_FRESH_INTERPRETER = """
import sys
sys.argv = ["reconciler", "up", "-f", sys.argv[1], "--timeout", "60s"]
from reconciler.cli.app import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
heavy = (
    "sqlalchemy",
    "sqlmodel",
    "reconciler.agent.artifacts",
    "reconciler.agent.artifactcache",
    "reconciler.controller.ingest",
)
print(sorted(m for m in sys.modules if m in heavy or m.partition(".")[0] in heavy))
"""


def test_up_of_a_plain_job_on_a_new_store_imports_only_what_it_uses(env):
    """`up`'s fixed cost: a new store's tables come from precompiled DDL (no SQLAlchemy or
    SQLModel), and a job without an artifact, in a controller that consumes no Source,
    loads neither the artifact cache nor the Source ingestion."""
    path = env.write("jobs.yaml", job_yaml("plain", "command: ['true']"))
    done = subprocess.run(
        [sys.executable, "-c", _UP_IN_A_FRESH_INTERPRETER, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RECONCILER_STORE": env.url, "XDG_STATE_HOME": str(env.xdg)},
        cwd=env.root,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    assert env.status("plain")["outcome"] == "Succeeded"
