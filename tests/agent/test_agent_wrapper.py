"""The run wrapper's protocol, held by both builds (the sh script and the C program: the
`spawn` fixture runs each test under both), and how the agent chooses between them."""

from __future__ import annotations

import os
import signal
import stat
import uuid

import psutil
import pytest

from reconciler.agent import cwrapper
from reconciler.agent.identity import is_alive
from reconciler.agent.local import LocalAgent
from reconciler.agent.process import ExitRecord, read_exit, signal_group, wait_armed
from reconciler.agent.wrapper import WRAPPER_NAME
from reconciler.api.job import JobSpec

from .conftest import group_names, wait_until


def test_the_exit_record_is_one_owner_only_line(spawn):
    _, run_dir = spawn(argv=["sh", "-c", "umask 000; exit 42"])
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(42, None)
    assert (run_dir / "exit").read_bytes() == b"42\n"
    assert stat.S_IMODE((run_dir / "exit").stat().st_mode) == 0o600


@pytest.mark.parametrize("wrapper", ["c", "forkserver"], indirect=True)
def test_the_c_wrappers_exit_record_is_stamped_when_the_command_ended_not_by_the_coarse_clock(spawn, tmp_path):
    """A run's finishedAt is its exit record's mtime. A file's own mtime comes from the
    kernel's coarse clock, up to a tick (4 ms at HZ=250) behind the real time: the C wrapper
    stamps the record with the moment it saw the command end, which is after the command's
    last instant (its `date`, read from the precise clock). The sh script keeps the coarse
    mtime (README, "Runs")."""
    for n in range(5):
        marker = tmp_path / f"ended-{n}"
        identity, run_dir = spawn(argv=["sh", "-c", f"date +%s%N > {marker}"])
        assert wait_until(lambda run_dir=run_dir: read_exit(run_dir)) is not None
        # the record's line is complete before its stamp is set: read the stamp once the
        # wrapper is gone, as the agent does
        wait_until(lambda identity=identity: not is_alive(identity), message="the wrapper ended")
        last_instant = int(marker.read_text())
        recorded = (run_dir / "exit").stat().st_mtime_ns
        assert last_instant <= recorded < last_instant + 5 * 10**9, (n, last_instant, recorded)


def test_a_command_killed_by_a_signal_is_recorded_as_128_plus_it(spawn):
    _, run_dir = spawn(argv=["sh", "-c", "kill -USR2 $$"])
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(128 + signal.SIGUSR2, signal.SIGUSR2)


def test_a_signal_before_the_command_starts_means_it_never_starts(spawn, tmp_path):
    # The wrapper blocks opening a FIFO as its "cgroup.procs", after its traps are armed and
    # before the command: a stop that lands there is recorded, and the command never runs.
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    identity, run_dir = spawn(argv=["touch", str(tmp_path / "ran")], join=[gate])
    wait_armed(identity.pid)
    assert signal_group(identity, signal.SIGTERM)
    reader = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)  # lets a blocked (or restarted) open through
    try:
        assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(143, 15)
    finally:
        os.close(reader)
    assert not (tmp_path / "ran").exists()


def test_the_wrapper_joins_each_file_with_its_own_pid_before_the_command(spawn, tmp_path):
    first, second = tmp_path / "a.procs", tmp_path / "b.procs"
    identity, run_dir = spawn(argv=["cat", str(first), str(second)], join=[first, second])
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(0, None)
    assert (run_dir / "stdout").read_text() == f"{identity.pid}\n" * 2


def test_the_wrapper_joins_a_tasks_file_as_its_own_thread_and_a_procs_file_by_its_pid(spawn, tmp_path):
    """0 to a v1 `tasks` (the writer's own thread: the kernel's fast path for a join) and the
    pid to a `cgroup.procs`, whichever wrapper starts the run."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    tasks, procs = tmp_path / "v1" / "tasks", tmp_path / "v2" / "cgroup.procs"
    identity, run_dir = spawn(argv=["cat", str(tasks), str(procs)], join=[tasks, procs])
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(0, None)
    assert (run_dir / "stdout").read_text() == f"0\n{identity.pid}\n"


def test_a_join_that_fails_is_said_on_stderr_and_the_run_goes_on(spawn, tmp_path):
    _, run_dir = spawn(argv=["echo", "ran"], join=[tmp_path / "gone" / "cgroup.procs"])
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(0, None)
    assert (run_dir / "stdout").read_text() == "ran\n"
    assert "gone/cgroup.procs" in (run_dir / "stderr").read_text()


def test_the_c_wrapper_makes_a_new_runs_log_files_private_and_says_when_it_cannot(c_wrapper, tmp_path):
    """spawn_run leaves a new run's log files to the C wrapper (off the agent's thread): it
    makes them 0600; a stdout it cannot make is said on stderr, and the run goes on."""
    import subprocess

    def run(run_dir):
        argv = [str(c_wrapper), "-c", "-", WRAPPER_NAME, str(run_dir), "0", "", "", "/bin/echo", "ran"]
        old = os.umask(0o022)  # what would leave a file made with 0666 readable by all
        try:
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
        finally:
            os.umask(old)

    made = tmp_path / "made"
    made.mkdir(mode=0o700)
    run(made)
    assert read_exit(made) == ExitRecord(0, None)
    assert (made / "stdout").read_text() == "ran\n"
    for name in ("stdout", "stderr"):
        assert stat.S_IMODE((made / name).stat().st_mode) == 0o600, name

    blocked = tmp_path / "blocked"
    (blocked / "stdout").mkdir(parents=True)  # no file can be made there
    run(blocked)
    assert read_exit(blocked) == ExitRecord(0, None)
    assert "reconciler-run: stdout: Is a directory" in (blocked / "stderr").read_text()


def test_the_address_space_limit_is_set_soft_and_hard(spawn):
    _, run_dir = spawn(argv=["sh", "-c", "ulimit -S -v; ulimit -H -v"], address_space_kib=300 * 1024)
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(0, None)
    assert (run_dir / "stdout").read_text() == f"{300 * 1024}\n{300 * 1024}\n"


def test_a_script_without_a_shebang_runs_under_sh(spawn, tmp_path):
    script = tmp_path / "plain"
    script.write_text("echo from sh\nexit 4\n")
    script.chmod(0o700)
    _, run_dir = spawn(argv=[str(script)])
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(4, None)
    assert (run_dir / "stdout").read_text() == "from sh\n"


def test_the_command_gets_default_signal_dispositions_and_an_open_mask(spawn):
    # The wrapper catches (never ignores) signals and blocks them around the start: none of
    # it may reach the command.
    _, run_dir = spawn(argv=["grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"])
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(0, None)
    lines = dict(line.split(":\t") for line in (run_dir / "stdout").read_text().splitlines())
    assert int(lines["SigBlk"], 16) == 0
    caught = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}
    assert not any(int(lines["SigIgn"], 16) & (1 << (sig - 1)) for sig in caught)


# How the agent chooses: the C build where a compiler exists, the sh script where none does.


def _spec() -> JobSpec:
    return JobSpec.model_validate({"command": ["sleep", "60"]})


def _start_and_find(agent: LocalAgent) -> list[str]:
    """Start a run through the agent, check a restarted agent would find it by its argv, stop
    it; the wrapper's argv."""
    uid = str(uuid.uuid4())  # the run's cgroup is named by it, machine-wide: one per test run
    started = agent.start("job", uid, 1, _spec(), 1)
    run_dir = agent.run_dir("job", uid, 1)
    try:
        # a fork server's copy takes the wrapper's title just after its fork
        argv = wait_until(lambda: (a := psutil.Process(started.identity.pid).cmdline())[3] == WRAPPER_NAME and a)
        assert argv[4] == str(run_dir.resolve())
        assert agent.find(run_dir) == started.identity
        wait_until(lambda: group_names(started.identity) == ["sh", "sleep"])
        agent.terminate(started.identity, started.cgroup)
        assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(143, 15)
        return argv
    finally:
        _end(agent, started.identity, started.cgroup)


def _end(agent: LocalAgent, identity, cgroup) -> None:  # type: ignore[no-untyped-def]
    agent.kill(identity, cgroup, wrapper_too=True)
    wait_until(lambda: not agent.alive(identity, cgroup))
    agent.remove_cgroup(cgroup)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "reconciler" / "bin"


@pytest.mark.usefixtures("c_wrapper")  # skips where no compiler exists
def test_the_agent_builds_the_c_wrapper_once_and_runs_under_it(tmp_path, own_cache):
    state = tmp_path / "state"
    agent = LocalAgent("node-a", state, on_exit=lambda job: None)
    try:
        binary = agent.wrapper.wait(120)
        assert binary == state / "bin" / cwrapper.binary_name()
        assert stat.S_IMODE(binary.stat().st_mode) == 0o700
        assert stat.S_IMODE(binary.parent.stat().st_mode) == 0o700
        assert _start_and_find(agent)[0] == str(binary)
        assert [p.name for p in binary.parent.iterdir()] == [binary.name]  # no temporary left
        assert (own_cache / binary.name).exists()  # kept for the next state folder
    finally:
        agent.close()
    again = LocalAgent("node-a", state, on_exit=lambda job: None)
    try:
        assert again.wrapper.path == binary  # found at once: no build, no thread
    finally:
        again.close()


def test_a_new_state_folder_takes_the_wrapper_from_the_cache_without_a_compiler(tmp_path, own_cache, monkeypatch):
    first = cwrapper.build(tmp_path / "one")
    if first is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no cc, gcc or clang on it
    assert cwrapper.compiler() is None
    assert cwrapper.build(tmp_path / "two") == tmp_path / "two" / "bin" / first.name
    assert (own_cache / first.name).exists()


@pytest.mark.usefixtures("own_cache")
@pytest.mark.parametrize("cc", ["none", "false"])
def test_without_a_working_compiler_runs_use_the_sh_wrapper(tmp_path, monkeypatch, cc):
    # "none": the operator's word, or no compiler on the machine; "false": one that fails
    monkeypatch.setenv(cwrapper.CC_ENV, cc)
    agent = LocalAgent("node-a", tmp_path / "state", on_exit=lambda job: None)
    try:
        assert agent.wrapper.wait(60) is None
        assert _start_and_find(agent)[:2] == ["/bin/sh", "-c"]
        assert not any((tmp_path / "state" / "bin").glob("reconciler-run-*"))
    finally:
        agent.close()


@pytest.mark.usefixtures("own_cache")
def test_a_broken_build_is_never_used(tmp_path, monkeypatch):
    # a "compiler" that writes an executable which does not keep the protocol
    fake = tmp_path / "fakecc"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\nprintf "#!/bin/sh\\nexit 0\\n" > "$2"\n')
    fake.chmod(0o700)
    monkeypatch.setenv(cwrapper.CC_ENV, str(fake))
    assert cwrapper.build(tmp_path / "state") is None
    assert not any((tmp_path / "state" / "bin").iterdir())


@pytest.mark.usefixtures("c_wrapper")
def test_a_run_of_the_sh_wrapper_is_found_by_an_agent_that_has_the_c_one(tmp_path):
    # an agent restarted after an upgrade adopts the runs its predecessor started under sh
    state = tmp_path / "state"
    before = LocalAgent("node-a", state, on_exit=lambda job: None)
    before.wrapper.path = None
    uid = str(uuid.uuid4())
    started = before.start("job", uid, 1, _spec(), 1)
    before.close()
    after = LocalAgent("node-a", state, on_exit=lambda job: None)
    try:
        assert after.wrapper.wait(120) is not None
        assert after.find(after.run_dir("job", uid, 1)) == started.identity
    finally:
        _end(after, started.identity, started.cgroup)
        after.close()


@pytest.mark.usefixtures("c_wrapper")
def test_a_removed_binary_sends_runs_to_the_sh_wrapper(tmp_path):
    agent = LocalAgent("node-a", tmp_path / "state", on_exit=lambda job: None)
    try:
        binary = agent.wrapper.wait(120)
        assert binary is not None
        binary.unlink()  # someone cleaned the state folder
        assert _start_and_find(agent)[:2] == ["/bin/sh", "-c"]
    finally:
        agent.close()


@pytest.mark.usefixtures("c_wrapper")
def test_a_cache_that_cannot_be_written_still_gives_the_state_its_build(tmp_path, monkeypatch):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert cwrapper.build(tmp_path / "state") == tmp_path / "state" / "bin" / cwrapper.binary_name()


def test_a_run_is_found_again_whichever_way_the_state_folder_is_spelled(tmp_path):
    """The agent resolves its state folder once: the wrapper's argv names the run dir by its
    real path, which an agent restarted through a symlink (or without one) finds again."""
    real = tmp_path / "real-state"
    real.mkdir()
    link = tmp_path / "linked-state"
    link.symlink_to(real)
    before = LocalAgent("node-a", link, on_exit=lambda job: None)
    uid = str(uuid.uuid4())
    started = before.start("job", uid, 1, _spec(), 1)
    argv = wait_until(lambda: (a := psutil.Process(started.identity.pid).cmdline())[3] == WRAPPER_NAME and a)
    before.close()
    assert argv[4] == str(real / "runs" / f"job.{uid}.1")
    for spelled in (link, real):
        after = LocalAgent("node-a", spelled, on_exit=lambda job: None)
        try:
            assert after.find(after.run_dir("job", uid, 1)) == started.identity
        finally:
            after.close()
    agent = LocalAgent("node-a", real, on_exit=lambda job: None)
    try:
        _end(agent, started.identity, started.cgroup)
    finally:
        agent.close()
