"""Run logs through the CLI with a real controller: a run writing past its logLimit keeps
about that much on disk while it runs and `logs` shows its newest whole lines; `logs` of a
large log takes little memory; `logs` of a run that never started says so."""

from __future__ import annotations

import hashlib
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

from tests.helpers import wait_until

from .conftest import Env, docs, job_yaml

LIMIT = 256 * 1024
SLACK = 16 * 1024  # a block the trimmer leaves, and the filesystem's own
LINE = re.compile(r"line (\d{9})")


def cli_env(env: Env) -> dict[str, str]:
    return {**os.environ, "RECONCILER_STORE": env.url, "XDG_STATE_HOME": str(env.xdg)}


def test_a_run_writing_past_its_log_limit_keeps_about_that_much_on_disk(env):
    go = env.root / "go"
    env.controller()
    env.apply(
        "chatty.yaml",
        job_yaml(
            "chatty",
            f"""
        shell: "seq -f 'line %09.0f' 1 350000; while [ ! -e '{go}' ]; do sleep 0.05; done; echo done"
        logLimit: 256Ki
    """,
        ),
    )
    env.wait_status("chatty", lambda s: s.get("phase") == "Running" and s.get("runs"), what="running")
    out = env.run_dir("chatty", 1) / "stdout"
    written = 350_000 * 15  # 5.25 MB
    wait_until(lambda: out.stat().st_size == written, timeout=30, message="the run wrote its lines")
    # the agent looks once a second and frees the head's blocks; the apparent size stays
    wait_until(
        lambda: out.stat().st_blocks * 512 <= LIMIT + SLACK,
        timeout=30,
        message=f"{out} kept within {LIMIT} bytes on disk",
    )
    assert env.status("chatty")["phase"] == "Running"
    assert out.stat().st_size == written

    shown = env.ok("logs", "job/chatty").stdout
    kept = [int(LINE.fullmatch(line).group(1)) for line in shown.splitlines()]  # whole lines, no NUL
    assert kept == list(range(kept[0], 350_001))  # the newest, none of the first
    assert kept[0] > 1 and LIMIT - 15 <= len(shown) <= LIMIT + SLACK
    assert env.ok("logs", "job/chatty", "--tail", "2").stdout == "line 000349999\nline 000350000\n"

    # following: the kept lines, then what the run writes until it ends
    follower = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "logs", "job/chatty", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=env.root,
        env=cli_env(env),
    )
    try:
        assert follower.stdout is not None
        head: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: head.put(follower.stdout.read(len(shown))), daemon=True).start()
        assert head.get(timeout=60) == shown  # the kept lines are out: the run's end is followed from here
        go.touch()
        rest, errors = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, errors
    assert rest == "done\n"

    env.wait_completed("chatty")
    assert env.ok("logs", "job/chatty").stdout == shown + "done\n"
    assert out.stat().st_blocks * 512 <= LIMIT + SLACK


PEAK_RSS = """
import resource, subprocess, sys
with open(sys.argv[1], "wb") as out:
    code = subprocess.call(sys.argv[2:], stdout=out)
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss(env: Env, out: Path, *args: str) -> int:
    """Peak RSS in bytes of `reconciler ARGS` (exit 0 asserted), its stdout written to `out`:
    a helper process runs it and asks the kernel for its child's high-water mark."""
    helper = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(out), sys.executable, "-m", "reconciler", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=env.root,
        env=cli_env(env),
    )
    code, peak_kib = map(int, helper.stdout.split())
    assert code == 0, f"reconciler {' '.join(args)} -> {code}\n{helper.stderr}"
    return peak_kib * 1024


def digest(*parts: bytes | Path) -> str:
    sha = hashlib.sha256()
    for part in parts:
        if isinstance(part, bytes):
            sha.update(part)
            continue
        with open(part, "rb") as f:
            while block := f.read(1 << 20):
                sha.update(block)
    return sha.hexdigest()


def test_logs_of_a_large_log_take_little_memory(env):
    """The CLI's own size (an interpreter with its libraries, ~60 MB) is measured on a
    one-line log; `logs` of a 50 MB log must add little to it, with or without -f, --tail."""
    env.write(
        "jobs.yaml",
        docs(
            job_yaml("big", "shell: \"seq -f 'line %09.0f of a large log' 1 1700000; echo err >&2\""),
            job_yaml("small", "shell: 'echo one line'"),
        ),
    )
    assert env.up(env.root / "jobs.yaml").code == 0
    log = env.run_dir("big", 1) / "stdout"
    size = log.stat().st_size
    assert size > 45_000_000

    baseline = peak_rss(env, env.root / "small.out", "logs", "job/small")
    tail = 1_600_000
    cases = {
        "whole": (("logs", "job/big"), digest(log, b"err\n")),
        "follow": (("logs", "job/big", "-f", "--stream", "stdout"), digest(log)),
        "tail": (("logs", "job/big", "--stream", "stdout", "--tail", str(tail)), None),
    }
    for name, (args, expected) in cases.items():
        out = env.root / f"{name}.out"
        grew = peak_rss(env, out, *args) - baseline
        assert grew < size / 8, f"{name}: {grew / 2**20:.1f} MiB over the baseline for a {size / 2**20:.0f} MiB log"
        if expected is not None:
            assert digest(out) == expected, name
    with open(env.root / "tail.out", "rb") as f:
        first = f.readline()
    assert first == b"line %09d of a large log\n" % (1_700_000 - tail + 1)
    assert (env.root / "tail.out").stat().st_size == tail * len(first)


def test_logs_of_a_run_that_never_started_say_so(env):
    env.write("missing.yaml", job_yaml("missing", "command: [no-such-program-here]"))
    assert env.up(env.root / "missing.yaml").code == 1
    for args in (("logs", "job/missing"), ("logs", "job/missing", "-f"), ("logs", "job/missing", "--tail", "5")):
        result = env.cli(*args)
        assert (result.code, result.stdout) == (1, ""), (args, result)
        assert result.stderr.splitlines() == [
            'error: run 1 of job "missing" never started (StartFailed): it has no logs'
        ], args

    # a job without any run keeps its answer: not found (3)
    env.apply("idle.yaml", job_yaml("idle", "command: ['true']"))
    idle = env.cli("logs", "job/idle")
    assert idle.code == 3 and 'job "idle" has no runs yet' in idle.stderr


def test_logs_show_the_kept_bytes_colour_codes_included(env):
    """Piped (no terminal), `logs` wrote the run's text without its escapes (click's echo
    strips colour codes then): not the kept bytes."""
    env.write("colour.yaml", job_yaml("colour", "shell: printf 'o\\033[1mB\\033[0m\\n'"))
    assert env.up(env.root / "colour.yaml").code == 0
    assert env.cli("logs", "job/colour").stdout == "o\x1b[1mB\x1b[0m\n"
