"""Runs: argv vs shell, env, workingDir, captured output, `logs` (--stream, --tail, --run,
-f), private log files, and a missing executable."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from tests.helpers import wait_until

from .conftest import docs, job_yaml


def test_commands_output_and_logs(env):
    folder = env.root / "manifests"
    (folder / "sub").mkdir(parents=True)
    marker = env.root / "tried-once"
    env.write(
        "manifests/runs.yaml",
        docs(
            job_yaml("literal", "command: [echo, '$HOME', '*']"),
            job_yaml("shelled", "shell: 'echo \"$GREETING from $0\"; echo oops >&2'\nenv: {GREETING: hello}"),
            job_yaml("where", "command: [pwd]\nworkingDir: sub"),
            job_yaml("lines", "shell: 'for i in 1 2 3 4 5; do echo out-$i; done; echo err-1 >&2; echo err-2 >&2'"),
            job_yaml(
                "twice",
                f"shell: \"if [ -e '{marker}' ]; then echo attempt-2; "
                f"else touch '{marker}'; echo attempt-1; exit 1; fi\"\n"
                "retry: {limit: 1, backoff: {delay: 100ms}}",
            ),
            job_yaml("missing", "command: [no-such-program-here, --flag]\nretry: {limit: 2, backoff: {delay: 100ms}}"),
        ),
    )
    # a relative -f from the test folder: workingDir must still resolve against the manifest's folder
    result = env.cli("--store", env.url, "up", "-f", "manifests/runs.yaml", "--timeout", "60s", cwd=env.root)
    assert result.code == 1, result.stderr  # `missing` failed
    jobs = env.jobs()
    assert {n: j["status"]["outcome"] for n, j in jobs.items()} == {
        "literal": "Succeeded",
        "shelled": "Succeeded",
        "where": "Succeeded",
        "lines": "Succeeded",
        "twice": "Succeeded",
        "missing": "Failed",
    }

    def out(name: str, number: int = 1, stream: str = "stdout") -> str:
        return (env.run_dir(name, number) / stream).read_text()

    # argv is not interpreted by a shell; `shell` is, with env
    assert out("literal") == "$HOME *\n"
    assert (out("shelled"), out("shelled", stream="stderr")) == ("hello from /bin/sh\n", "oops\n")
    # a relative workingDir is the manifest's folder, not the caller's
    assert out("where") == f"{os.path.realpath(folder / 'sub')}\n"
    assert jobs["where"]["spec"]["workingDir"] == str(folder / "sub")

    # `logs`: both streams by default, one with --stream, the last lines with --tail, any run with --run
    both, stderr, tail, first, latest, absent, every = env.cli_all(
        ("logs", "job/lines"),
        ("logs", "job/shelled", "--stream", "stderr"),
        ("logs", "job/lines", "--stream", "stdout", "--tail", "2"),
        ("logs", "job/twice", "--run", "1"),
        ("logs", "job/twice"),
        ("logs", "job/twice", "--run", "7"),
        ("logs", "job/lines", "--tail", "-1"),  # kubectl's -1: every line
    )
    assert both.stdout == "".join(f"out-{i}\n" for i in range(1, 6)) + "err-1\nerr-2\n"
    assert (every.code, every.stdout) == (0, both.stdout)
    # API.md 1.2 spells unset fields null: a run that exited on its own has no signal or reason
    [run] = jobs["lines"]["status"]["runs"]
    assert (run["exitCode"], run["signal"], run["reason"]) == (0, None, None)
    assert jobs["lines"]["status"]["outcome"] == "Succeeded"
    assert stderr.stdout == "oops\n"
    assert tail.stdout == "out-4\nout-5\n"
    assert [r["number"] for r in jobs["twice"]["status"]["runs"]] == [1, 2]
    assert (first.stdout, latest.stdout) == ("attempt-1\n", "attempt-2\n")
    assert absent.code == 3 and absent.stdout == ""
    assert all(r.code == 0 for r in (both, stderr, tail, first, latest))

    # log files are private to the user
    for name, number in [("lines", 1), ("twice", 1), ("twice", 2)]:
        for stream in ("stdout", "stderr", "exit"):
            path = env.run_dir(name, number) / stream
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path, oct(path.stat().st_mode))

    # a program that does not exist: the run is StartFailed, the job Failed, not retried
    status = jobs["missing"]["status"]
    assert status["reason"] == "StartFailed"
    (run,) = status["runs"]
    assert run["outcome"] == "StartFailed" and run["reason"] == "StartFailed" and run.get("exitCode") is None
    assert "no-such-program-here" in status["message"]


def test_logs_follow_returns_when_the_run_ends(env):
    go = env.root / "go"
    env.controller()
    env.apply(
        "follow.yaml",
        job_yaml(
            "follow",
            f"""
        shell: "echo first; echo warn >&2; while [ ! -e '{go}' ]; do sleep 0.05; done; echo last"
    """,
        ),
    )
    env.wait_status("follow", lambda s: s.get("phase") == "Running" and s.get("runs"), what="running")
    out_path = env.root / "follow.out"
    with open(out_path, "wb") as out:
        follower = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "logs", "job/follow", "-f", "--stream", "stdout"],
            stdout=out,
            stderr=subprocess.PIPE,
            cwd=env.root,
            env={**os.environ, "RECONCILER_STORE": env.url},
        )
        try:
            wait_until(lambda: out_path.read_text() == "first\n" or follower.poll() is not None, timeout=30)
            assert follower.poll() is None, "logs -f returned while the run was still going"
            go.touch()
            follower.wait(30)
        finally:
            if follower.poll() is None:
                follower.kill()
    assert follower.returncode == 0, follower.stderr.read()
    assert out_path.read_text() == "first\nlast\n"
    assert env.status("follow")["runs"][0].get("finishedAt")
