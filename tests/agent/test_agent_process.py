"""spawn_run, read_exit, identity and reaping, with real processes."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import time

import psutil
import pytest

from reconciler.agent.identity import same_process, start_time_of, wall_clock_start
from reconciler.agent.process import (
    ExitRecord,
    ProcessIdentity,
    StartFailed,
    is_alive,
    read_exit,
    reap,
    spawn_run,
)

from .conftest import wait_until


def finished(run_dir: pathlib.Path) -> ExitRecord:
    return wait_until(lambda: read_exit(run_dir))


def test_argv_run_records_exit_zero_and_captures_stdout(spawn):
    _, run_dir = spawn(argv=["printf", "%s\n", "hello"])
    assert finished(run_dir) == ExitRecord(exit_code=0, signal=None)
    assert (run_dir / "stdout").read_text() == "hello\n"
    assert (run_dir / "stderr").read_text() == ""


def test_argv_run_records_nonzero_exit_and_captures_stderr(spawn):
    _, run_dir = spawn(argv=["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert finished(run_dir) == ExitRecord(exit_code=3, signal=None)
    assert (run_dir / "stdout").read_text() == "out\n"
    assert (run_dir / "stderr").read_text() == "err\n"


def test_exit_is_recorded_without_fsync_too(spawn):
    _, run_dir = spawn(argv=["sh", "-c", "exit 9"], fsync_exit=False)
    assert finished(run_dir) == ExitRecord(exit_code=9, signal=None)


def test_shell_run_is_interpreted_by_sh(spawn):
    _, run_dir = spawn(shell="echo abc | tr a x; exit 7")
    assert finished(run_dir) == ExitRecord(exit_code=7, signal=None)
    assert (run_dir / "stdout").read_text() == "xbc\n"


def test_argv_is_not_interpreted_by_a_shell(spawn):
    _, run_dir = spawn(argv=["echo", "$HOME;ls"])
    assert finished(run_dir).exit_code == 0
    assert (run_dir / "stdout").read_text() == "$HOME;ls\n"
    # no word splitting, no globbing, no redirection
    _, run_dir = spawn(argv=["printf", "[%s]\n", "a b", "*", ">x"])
    assert finished(run_dir).exit_code == 0
    assert (run_dir / "stdout").read_text() == "[a b]\n[*]\n[>x]\n"


def test_argv_runs_the_program_not_a_shell_builtin(spawn):
    # dash's builtin echo expands backslash escapes; /bin/echo does not
    _, run_dir = spawn(argv=["echo", "a\\tb"])
    assert finished(run_dir).exit_code == 0
    assert (run_dir / "stdout").read_text() == "a\\tb\n"


def test_env_is_merged_over_the_environment_and_stdin_is_empty(spawn):
    _, run_dir = spawn(shell='echo "$RECONCILER_T1:${PATH:+has-path}"; cat', env={"RECONCILER_T1": "x"})
    assert finished(run_dir).exit_code == 0
    assert (run_dir / "stdout").read_text() == "x:has-path\n"


def test_relative_program_resolves_against_the_run_cwd(spawn, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = work / "hello.sh"
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(0o755)
    _, run_dir = spawn(argv=["./hello.sh"], cwd=work)
    assert finished(run_dir).exit_code == 0
    assert (run_dir / "stdout").read_text() == f"{work}\n"


def test_start_failed_for_missing_program_or_cwd(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(StartFailed, match="no-such-program-xyz"):
        spawn_run(argv=["no-such-program-xyz"], env={}, cwd=str(tmp_path), run_dir=run_dir)
    with pytest.raises(StartFailed, match="does not exist"):
        spawn_run(argv=["true"], env={}, cwd=str(tmp_path / "absent"), run_dir=run_dir)
    with pytest.raises(StartFailed, match="does not exist"):
        spawn_run(shell="true", env={}, cwd=str(tmp_path / "absent"), run_dir=run_dir)
    plain = tmp_path / "not-executable"
    plain.write_text("echo hi\n")
    with pytest.raises(StartFailed):
        spawn_run(argv=[str(plain)], env={}, cwd=str(tmp_path), run_dir=run_dir)
    with pytest.raises(StartFailed):  # PATH comes from the merged env
        spawn_run(argv=["true"], env={"PATH": str(tmp_path)}, cwd=str(tmp_path), run_dir=run_dir)
    assert not run_dir.exists()  # nothing was spawned or created


def test_exactly_one_of_argv_and_shell(tmp_path):
    for kwargs in ({}, {"argv": ["true"], "shell": "true"}, {"argv": []}):
        with pytest.raises(ValueError):
            spawn_run(env={}, cwd=str(tmp_path), run_dir=tmp_path / "run", **kwargs)


def test_files_and_run_dir_are_owner_only(spawn, tmp_path):
    _, run_dir = spawn(argv=["true"], run_dir=tmp_path / "a" / "b" / "run")
    finished(run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for name in ("stdout", "stderr", "exit"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    assert not (run_dir / "exit.tmp").exists()


def test_respawn_in_the_same_dir_does_not_see_the_old_exit(spawn, tmp_path):
    run_dir = tmp_path / "run"
    _, _ = spawn(argv=["sh", "-c", "exit 4"], run_dir=run_dir)
    assert finished(run_dir).exit_code == 4
    (run_dir / "stdout").chmod(0o644)
    os.mkfifo(tmp_path / "gate")  # keeps the second run waiting until teardown
    spawn(argv=["sh", "-c", "read x < ./gate; exit 6"], run_dir=run_dir)
    assert read_exit(run_dir) is None
    assert stat.S_IMODE((run_dir / "stdout").stat().st_mode) == 0o600


def test_identity_is_the_group_leading_wrapper(spawn, tmp_path, fork_server):
    os.mkfifo(tmp_path / "gate")
    identity, run_dir = spawn(argv=["sh", "-c", "read x < ./gate; exit 5"])
    wait_until(lambda: os.getsid(identity.pid) == identity.pid)  # a fork server's copy: just after its fork
    assert os.getpgid(identity.pid) == identity.pid
    assert is_alive(identity)
    assert reap(identity) is None  # still running: nothing to collect
    (tmp_path / "gate").write_text("go\n")
    assert finished(run_dir) == ExitRecord(exit_code=5, signal=None)
    wait_until(lambda: not is_alive(identity))  # a zombie is not alive
    if fork_server is None:  # our child: collected here, with its status
        assert wait_until(lambda: reap(identity)) == 5
    else:  # the fork server's: collected by it, its status in the record only
        wait_until(lambda: start_time_of(identity.pid) is None)
        assert reap(identity) is None
    assert not psutil.pid_exists(identity.pid) or not is_alive(identity)


def test_is_alive_requires_the_same_start_time():
    me = psutil.Process()
    assert is_alive(ProcessIdentity(pid=me.pid, start_time=me.create_time()))
    assert not is_alive(ProcessIdentity(pid=me.pid, start_time=me.create_time() - 5))
    assert not is_alive(ProcessIdentity(pid=me.pid, start_time=me.create_time() + 0.5))


def test_the_start_time_read_directly_is_psutils_exactly_for_a_live_process_and_a_zombie():
    """Stored identities are compared with psutil's create_time (same_process): the direct read
    of /proc that spawning and liveness checks use must give the very same number."""
    proc = subprocess.Popen(["sleep", "5"])
    try:
        assert start_time_of(proc.pid) == psutil.Process(proc.pid).create_time()
        identity = ProcessIdentity(proc.pid, start_time_of(proc.pid) or 0.0)
        assert is_alive(identity)
        proc.kill()
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE)
        assert start_time_of(proc.pid) == psutil.Process(proc.pid).create_time()  # a zombie still answers
        assert not is_alive(identity)  # but is not alive
    finally:
        proc.kill()
        proc.wait()
    assert start_time_of(proc.pid) is None  # reaped: no such process (unless the pid was reused at once)
    assert not is_alive(identity)


def test_a_spawned_runs_start_time_is_read_at_its_first_use_and_is_psutils(spawn, fork_server):
    """spawn_run does not wait for the wrapper's exec to read its start time (the read would
    block until the exec is done); read later, it is the very number psutil gives. A fork
    server's copy comes with it, read by the server right after the fork."""
    identity, _ = spawn(argv=["sleep", "5"])
    assert identity.start_known == (fork_server is not None)
    assert identity.start_time == psutil.Process(identity.pid).create_time()
    assert identity.start_known
    assert is_alive(identity)
    assert identity == ProcessIdentity(identity.pid, psutil.Process(identity.pid).create_time())
    assert identity != ProcessIdentity(identity.pid, identity.start_time - 5)  # a reused pid
    assert hash(identity) == hash(ProcessIdentity(identity.pid, 0.0))


def test_reaping_a_spawned_run_reads_its_start_time_before_the_pid_is_freed(spawn, fork_server):
    """Once reaped, the pid may go to another process: the start time must be read first,
    else a later read (the run's record) could take a stranger's or none. (A fork server's copy
    is no child of ours and comes with its start time: see the test above.)"""
    if fork_server is not None:
        identity, run_dir = spawn(argv=["true"])
        started = identity.start_time
        finished(run_dir)
        wait_until(lambda: start_time_of(identity.pid) is None)  # reaped by the server
        assert reap(identity) is None and identity.start_time == started
        return
    identity, run_dir = spawn(argv=["true"])
    finished(run_dir)
    wait_until(lambda: psutil.Process(identity.pid).status() == psutil.STATUS_ZOMBIE)
    as_zombie = start_time_of(identity.pid)  # a zombie still answers; the identity is not told
    assert as_zombie is not None and not identity.start_known
    assert reap(identity) == 0  # a zombie: collected at once
    assert identity.start_known and identity.start_time == as_zombie
    assert start_time_of(identity.pid) is None  # reaped (unless the pid was reused at once)


def test_wall_clock_start_is_when_the_process_started_even_once_it_is_gone():
    before = time.time()
    proc = subprocess.Popen(["sleep", "5"])
    after = time.time()
    identity = ProcessIdentity(proc.pid, psutil.Process(proc.pid).create_time())
    proc.kill()
    proc.wait()  # gone and reaped: a quick run has often ended before its start is recorded
    started = wall_clock_start(identity)
    # ticks and uptime are counted in 1/100 s: allow two of them either side (psutil's own
    # figure, from the boot time in whole seconds, may be a second early)
    assert before - 0.02 <= started <= after + 0.02, (before, started, after)


def test_exit_record_decodes_signals(tmp_path):
    (tmp_path / "exit").write_text("137\n")
    assert read_exit(tmp_path) == ExitRecord(exit_code=137, signal=9)
    (tmp_path / "exit").write_text("128\n")
    assert read_exit(tmp_path) == ExitRecord(exit_code=128, signal=None)
    assert read_exit(tmp_path / "absent") is None


def test_an_exit_record_no_wrapper_writes_is_no_record(tmp_path):
    """A wrapper writes 0-255 (the status, or 128 + a signal); the run can write its folder,
    and a number past that is not an exit a status or an agent's report can hold."""
    (tmp_path / "exit").write_text("255\n")
    assert read_exit(tmp_path) == ExitRecord(exit_code=255, signal=127)
    for text in ("256\n", "-1\n", "100000000000000000001\n"):
        (tmp_path / "exit").write_text(text)
        assert read_exit(tmp_path) is None, text


def test_same_process_tells_a_zombie_from_a_reaped_or_reused_pid():
    """What the exit watcher asks before it collects a run's wrapper: a zombie is still the
    process, a wrong start time or a reaped pid is not."""
    proc = subprocess.Popen(["sleep", "5"])
    try:
        identity = ProcessIdentity(proc.pid, psutil.Process(proc.pid).create_time())
        assert same_process(identity)
        assert not same_process(ProcessIdentity(proc.pid, identity.start_time - 5))
        proc.kill()
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE)
        assert same_process(identity)  # not yet collected: still this process
    finally:
        proc.kill()
        proc.wait()
    assert not same_process(identity)  # reaped (unless the pid was reused at once, by another start)


def test_a_run_does_not_inherit_reconcilers_own_variables(spawn, monkeypatch):
    """The store URL (with its password), the server and tokens are the agent's, not the
    run's: a run that could read RECONCILER_STORE could rewrite the store."""
    monkeypatch.setenv("RECONCILER_STORE", "postgresql://admin:s3cret@db/prod")
    monkeypatch.setenv("RECONCILER_TOKEN", "t0ken")
    monkeypatch.setenv("OTHER_SETTING", "kept")
    _, run_dir = spawn(shell="env", env={"MINE": "given"})
    assert finished(run_dir).exit_code == 0
    seen = dict(line.split("=", 1) for line in (run_dir / "stdout").read_text().splitlines() if "=" in line)
    assert "RECONCILER_STORE" not in seen and "RECONCILER_TOKEN" not in seen
    assert "s3cret" not in (run_dir / "stdout").read_text()
    assert seen["OTHER_SETTING"] == "kept" and seen["MINE"] == "given"
