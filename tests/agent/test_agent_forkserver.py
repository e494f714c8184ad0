"""The C wrapper's fork server (forkserver.py): what it adds to the wrapper's protocol, which
the `spawn` fixture's "forkserver" runs hold it to. Its crash safety: the server's death
loses no run, the agent's death ends the server and no run, and a run a dead agent asked for
is found by the next one, however late the server forks it."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import psutil
import pytest

from reconciler.agent import forkserver
from reconciler.agent.forkserver import ForkServer, ForkServerError, ForkServerUnsure, wait_for_servers
from reconciler.agent.local import LocalAgent
from reconciler.agent.process import ExitRecord, read_exit, signal_group
from reconciler.api.job import JobSpec

from .conftest import REPO_ROOT, wait_until


def _server_of(agent: LocalAgent) -> psutil.Process:
    server = agent._server
    assert server is not None and server._proc is not None
    return psutil.Process(server._proc.pid)


def _remove_cgroup(state, name: str) -> None:  # type: ignore[no-untyped-def]
    agent = LocalAgent("node-a", state, on_exit=lambda job: None)
    try:
        wait_until(lambda: agent.remove_cgroup(name))
    finally:
        agent.close()


def _agent(state) -> LocalAgent:  # type: ignore[no-untyped-def]
    agent = LocalAgent("node-a", state, on_exit=lambda job: None)
    assert agent.wrapper.wait(120) is not None, "the C wrapper is built where a compiler exists"
    return agent


def test_runs_are_copies_of_one_server_and_outlive_its_death(tmp_path, c_wrapper):
    agent = _agent(tmp_path / "state")
    try:
        spec = JobSpec.model_validate({"command": ["sh", "-c", "read x < ./gate; exit 4"], "workingDir": str(tmp_path)})
        os.mkfifo(tmp_path / "gate")
        uid = str(uuid.uuid4())
        first = agent.start("job", uid, 1, spec, 1)
        cgroups = [first.cgroup]
        server = _server_of(agent)
        assert psutil.Process(first.identity.pid).ppid() == server.pid  # forked by it, not by us
        server.kill()  # kill -9 of the server: the run goes on, its record is its own
        server.wait(10)
        (tmp_path / "gate").write_text("go\n")
        assert wait_until(lambda: read_exit(agent.run_dir("job", uid, 1))) == ExitRecord(4, None)
        cgroups.append(agent.start("job", uid, 2, JobSpec.model_validate({"command": ["true"]}), 1).cgroup)
        assert _server_of(agent).pid != server.pid  # another server, started by the next run
        assert wait_until(lambda: read_exit(agent.run_dir("job", uid, 2))) == ExitRecord(0, None)
        for cgroup in cgroups:
            wait_until(lambda cgroup=cgroup: agent.remove_cgroup(cgroup))
    finally:
        agent.close()


def test_the_agents_death_ends_the_server_and_no_run(tmp_path, c_wrapper):
    uid = str(uuid.uuid4())  # the run's cgroup is named by it, machine-wide
    script = textwrap.dedent(
        f"""
        import os, pathlib, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from reconciler.agent.local import LocalAgent
        from reconciler.api.job import JobSpec
        agent = LocalAgent("node-a", pathlib.Path({str(tmp_path / "state")!r}), on_exit=lambda job: None)
        assert agent.wrapper.wait(120) is not None
        command = ["sh", "-c", "read x < ./gate; exit 6"]
        spec = JobSpec.model_validate({{"command": command, "workingDir": {str(tmp_path)!r}}})
        started = agent.start("job", {uid!r}, 1, spec, 1)
        print(started.identity.pid, agent._server._proc.pid, flush=True)
        sys.stdin.read()  # until the test kills this process
        """
    )
    os.mkfifo(tmp_path / "gate")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        run_pid, server_pid = map(int, proc.stdout.readline().split())
        proc.kill()  # kill -9 of the agent
        proc.wait(10)
        wait_until(lambda: not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == "zombie")
        assert psutil.Process(run_pid).is_running()
        (tmp_path / "gate").write_text("go\n")
        run_dir = tmp_path / "state" / "runs" / f"job.{uid}.1"
        assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(6, None)
    finally:
        proc.kill()
        proc.wait(10)
        _remove_cgroup(tmp_path / "state", f"job.{uid}.1")


def test_a_run_asked_of_a_dead_agents_server_is_found_however_late_it_is_forked(tmp_path, c_wrapper):
    """The agent dies once its request is written; its server is paused before reading it.
    The next agent looks for the run while the server still has not forked it: it waits for the
    server to end (and its copy to take the wrapper's title), and finds the run, rather than
    finding nothing and starting it a second time."""
    state = tmp_path / "state"
    uid = str(uuid.uuid4())
    script = textwrap.dedent(
        f"""
        import os, pathlib, signal, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from reconciler.agent.local import LocalAgent
        from reconciler.api.job import JobSpec
        agent = LocalAgent("node-a", pathlib.Path({str(state)!r}), on_exit=lambda job: None)
        assert agent.wrapper.wait(120) is not None
        agent.start("job", {uid!r}, 1, JobSpec.model_validate({{"command": ["true"]}}), 1)  # the server is up
        server = agent._server._proc
        os.kill(server.pid, signal.SIGSTOP)
        print(server.pid, flush=True)
        spec = JobSpec.model_validate({{"command": ["sleep", "60"]}})
        import reconciler.agent.forkserver as fs
        def die_after_writing(fd, data, _write=fs._write_all):
            _write(fd, data)
            os.kill(os.getpid(), signal.SIGKILL)
        fs._write_all = die_after_writing
        agent.start("job", {uid!r}, 2, spec, 1)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    server_pid = int(proc.stdout.readline())
    assert proc.wait(30) == -signal.SIGKILL
    run_dir = state / "runs" / f"job.{uid}.2"
    assert run_dir.is_dir() and read_exit(run_dir) is None
    agent = _agent(state)
    resume = threading.Timer(0.5, os.kill, (server_pid, signal.SIGCONT))  # the server, slow to fork
    resume.start()
    try:
        found = agent.find(run_dir)
        assert found is not None, "the run the dead agent asked for was not found: it would start twice"
        assert psutil.Process(found.pid).cmdline()[4] == str(run_dir)
        assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == "zombie"
        assert signal_group(found, signal.SIGTERM)
        assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(143, 15)
    finally:
        resume.join()
        for number in (1, 2):
            wait_until(lambda number=number: agent.remove_cgroup(agent.existing_cgroup("job", uid, number)))
        agent.close()
        with_pid = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in (p.info["cmdline"] or [])]
        for leftover in with_pid:
            leftover.kill()


def test_a_working_dir_gone_before_the_copy_starts_ends_the_run_127_with_the_reason(tmp_path, c_wrapper):
    (tmp_path / "locks").mkdir()
    server = ForkServer(c_wrapper, tmp_path / "locks")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    try:
        server.start(
            run_dir=run_dir,
            fsync=False,
            cgroups="",
            address_space_kib=None,
            cwd=str(tmp_path / "gone"),
            env={},
            command=["/bin/true"],
        )
        assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(127, None)
        assert f"{tmp_path / 'gone'}: No such file or directory" in (run_dir / "stderr").read_text()
    finally:
        server.close()


def test_fork_server_0_execs_a_wrapper_per_run(tmp_path, c_wrapper, monkeypatch):
    monkeypatch.setenv("RECONCILER_FORK_SERVER", "0")
    agent = _agent(tmp_path / "state")
    try:
        uid = str(uuid.uuid4())
        started = agent.start("job", uid, 1, JobSpec.model_validate({"command": ["sleep", "60"]}), 1)
        assert psutil.Process(started.identity.pid).ppid() == os.getpid()  # our child: no server
        assert agent._server is None
        agent.kill(started.identity, started.cgroup, wrapper_too=True)
        wait_until(lambda: not agent.alive(started.identity, started.cgroup))
        agent.remove_cgroup(started.cgroup)
    finally:
        agent.close()


def test_a_request_left_unanswered_is_not_a_start_failure_and_its_run_is_found(tmp_path, c_wrapper, monkeypatch):
    """The server forked the copy and died before its reply (or its reply could not be
    read): the start is not known, so it is not StartFailed (the job would end, or run again,
    beside the run) but ForkServerUnsure; the server is ended, and `find` waits for its lock
    and finds the run."""
    agent = _agent(tmp_path / "state")
    uid = str(uuid.uuid4())
    spec = JobSpec.model_validate({"command": ["sh", "-c", "read x < ./gate; exit 3"], "workingDir": str(tmp_path)})
    os.mkfifo(tmp_path / "gate")
    agent.start("job", uid, 1, JobSpec.model_validate({"command": ["true"]}), 1)  # the server is up
    server = agent._server
    assert server is not None and server._proc is not None
    first = server._proc.pid

    run_dir = agent.run_dir("job", uid, 2)

    def titled_copy() -> bool:  # run 2's copy: forked, in its own session, under its title
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info["cmdline"] or []
            if len(cmd) > 4 and cmd[4] == str(run_dir):
                with contextlib.suppress(ProcessLookupError):
                    return os.getsid(proc.info["pid"]) == proc.info["pid"]
        return False

    def no_answer(proc):  # type: ignore[no-untyped-def]
        wait_until(titled_copy)  # the server forked it; its answer is lost
        raise EOFError("the server ended")

    monkeypatch.setattr(server, "_reply", no_answer)
    try:
        with pytest.raises(ForkServerUnsure):
            agent.start("job", uid, 2, spec, 1)
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"  # ended
        found = agent.find(run_dir)
        assert found is not None, "a run the server forked before it failed to answer must be found"
        assert agent.existing_cgroup("job", uid, 2) is not None or agent.cgroup_version is None  # kept for it
        (tmp_path / "gate").write_text("go\n")
        assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(3, None)
        monkeypatch.undo()
        agent.start("job", uid, 3, JobSpec.model_validate({"command": ["true"]}), 1)  # another server
        assert wait_until(lambda: read_exit(agent.run_dir("job", uid, 3))) == ExitRecord(0, None)
        for number in (1, 2, 3):
            wait_until(lambda number=number: agent.remove_cgroup(agent.existing_cgroup("job", uid, number)))
    finally:
        agent.close()


def test_an_agent_holding_more_than_1024_descriptors_starts_runs(tmp_path, c_wrapper):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    (tmp_path / "locks").mkdir()
    server = ForkServer(c_wrapper, tmp_path / "locks")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    try:
        server.start(
            run_dir=run_dir,
            fsync=False,
            cgroups="",
            address_space_kib=None,
            cwd=str(tmp_path),
            env={},
            command=["/bin/true"],
        )
        assert server._proc is not None and server._proc.stdout is not None and server._proc.stdout.fileno() > 1024
        assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(0, None)
    finally:
        server.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_lock_is_held_by_the_server_even_when_descriptors_0_to_2_were_free(tmp_path, c_wrapper):
    script = textwrap.dedent(
        f"""
        import os, pathlib, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from reconciler.agent.forkserver import ForkServer
        out = os.fdopen(os.dup(1), "w")
        os.close(0)  # the lock file's descriptor would be 0: the server's stdin
        locks = pathlib.Path({str(tmp_path / "locks")!r}); locks.mkdir()
        server = ForkServer(pathlib.Path({str(c_wrapper)!r}), locks)
        run = pathlib.Path({str(tmp_path / "run")!r}); run.mkdir()
        how = dict(fsync=False, cgroups="", address_space_kib=None, cwd="/", env={{}})
        server.start(run_dir=run, command=["/bin/true"], **how)
        print(server._proc.pid, server._proc.args[2], flush=True, file=out)
        import signal; signal.pause()  # until the test kills it (its stdin is closed)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        server_pid, fd = map(int, proc.stdout.readline().split())
        assert fd >= 3
        assert "FLOCK" in (Path(f"/proc/{server_pid}/fdinfo/{fd}")).read_text()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_live_peers_server_is_not_waited_for_and_a_gone_ones_is(tmp_path, c_wrapper):
    """Two agents on one state folder (a standby beside a leader): the live one's server holds
    its lock for its life; it started no run the other may start, so the other does not wait
    for it. A server whose agent is gone is waited for until it has ended."""
    locks = tmp_path / "locks"
    locks.mkdir()
    script = textwrap.dedent(
        f"""
        import pathlib, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from reconciler.agent.forkserver import ForkServer
        server = ForkServer(pathlib.Path({str(c_wrapper)!r}), pathlib.Path({str(locks)!r}))
        run = pathlib.Path({str(tmp_path / "run")!r}); run.mkdir()
        how = dict(fsync=False, cgroups="", address_space_kib=None, cwd="/", env={{}})
        server.start(run_dir=run, command=["/bin/true"], **how)
        print(server._proc.pid, flush=True)
        sys.stdin.read()
        """
    )
    peer = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None
        server_pid = int(peer.stdout.readline())
        assert wait_for_servers(locks, timeout=3) is True  # a live peer's: not waited for
        os.kill(server_pid, signal.SIGSTOP)  # its server, slow to end once its agent is gone
        peer.kill()
        peer.wait(10)
        assert wait_for_servers(locks, timeout=1) is False  # the gone agent's server holds on
        os.kill(server_pid, signal.SIGCONT)  # it reads EOF and ends
        assert wait_for_servers(locks, timeout=10) is True
        assert list(locks.iterdir()) == []  # its lock file removed once free
    finally:
        peer.kill()
        peer.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGCONT)


def test_a_server_of_this_process_is_not_waited_for_by_another_agent_of_it(tmp_path, c_wrapper):
    """Two agents in one process on one state folder: the other's live server is no ended one."""
    locks = tmp_path / "locks"
    locks.mkdir()
    server = ForkServer(c_wrapper, locks)
    (tmp_path / "run").mkdir()
    try:
        how = dict(fsync=False, cgroups="", address_space_kib=None, cwd="/", env={})
        server.start(run_dir=tmp_path / "run", command=["/bin/true"], **how)  # type: ignore[arg-type]
        assert wait_for_servers(locks, timeout=1) is True
    finally:
        server.close()


def test_a_request_the_server_does_not_take_fails_the_start_and_starts_nothing(tmp_path, c_wrapper, monkeypatch):
    """A stopped server and a request bigger than the pipe holds: the write gives up, the
    server is ended before it could read the whole request, and the start failed (nothing was
    forked: a plain StartFailed is right)."""
    monkeypatch.setattr(forkserver, "ANSWER_TIMEOUT", 0.5)
    locks = tmp_path / "locks"
    locks.mkdir()
    server = ForkServer(c_wrapper, locks)
    (tmp_path / "run").mkdir()
    how = dict(fsync=False, cgroups="", address_space_kib=None, cwd="/")
    try:
        server.start(run_dir=tmp_path / "run", command=["/bin/true"], env={}, **how)  # type: ignore[arg-type]
        assert server._proc is not None
        stopped = server._proc.pid
        os.kill(stopped, signal.SIGSTOP)
        with pytest.raises(ForkServerError):
            server.start(run_dir=tmp_path / "run", command=["/bin/true"], env={"BIG": "x" * 300_000}, **how)  # type: ignore[arg-type]
        assert not psutil.pid_exists(stopped) or psutil.Process(stopped).status() == "zombie"
    finally:
        server.close()
