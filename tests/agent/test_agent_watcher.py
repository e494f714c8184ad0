"""ExitWatcher: exit notifications for our own runs and for adopted ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from reconciler.agent.identity import start_time_of
from reconciler.agent.process import (
    ExitRecord,
    ProcessIdentity,
    group_alive,
    is_alive,
    read_exit,
    reap,
    signal_group,
)
from reconciler.agent.watcher import ExitWatcher

from .conftest import REPO_ROOT, group_names, wait_until


class Recorder:
    """Thread-safe list of callback calls, with the thread each came from."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[ProcessIdentity, str]] = []

    def __call__(self, identity: ProcessIdentity) -> None:
        with self.lock:
            self.calls.append((identity, threading.current_thread().name))

    def identities(self) -> list[ProcessIdentity]:
        with self.lock:
            return [identity for identity, _ in self.calls]


@pytest.fixture
def watcher():
    with ExitWatcher() as w:
        yield w


def test_callback_after_our_run_exits_and_is_reaped(spawn, watcher, tmp_path):
    os.mkfifo(tmp_path / "gate")
    identity, run_dir = spawn(argv=["sh", "-c", "read x < ./gate; exit 3"])
    seen = Recorder()
    watcher.watch(identity, seen)
    assert seen.identities() == []  # nothing while it runs (it is blocked on the fifo)
    (tmp_path / "gate").write_text("go\n")
    wait_until(seen.identities)
    assert seen.calls == [(identity, "exit-watcher")]
    assert read_exit(run_dir) == ExitRecord(exit_code=3, signal=None)
    with pytest.raises(psutil.NoSuchProcess):  # reaped: not even a zombie is left
        psutil.Process(identity.pid).status()
    assert reap(identity) is None


def test_callback_promptly_for_an_identity_already_dead(spawn, watcher, fork_server):
    identity, run_dir = spawn(argv=["true"])
    wait_until(lambda: read_exit(run_dir))
    if fork_server is None:
        wait_until(lambda: reap(identity) is not None)  # gone entirely
    else:  # the server's copy, reaped by it
        wait_until(lambda: start_time_of(identity.pid) is None)
    seen = Recorder()
    watcher.watch(identity, seen)
    assert wait_until(seen.identities, timeout=5) == [identity]


def test_callback_promptly_for_a_zombie_child(spawn, watcher):
    identity, run_dir = spawn(argv=["true"])
    wait_until(lambda: read_exit(run_dir))
    wait_until(lambda: not is_alive(identity))  # a zombie: exited, not yet reaped
    seen = Recorder()
    watcher.watch(identity, seen)
    assert wait_until(seen.identities, timeout=5) == [identity]
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(identity.pid).status()


def test_callback_promptly_when_the_pid_now_belongs_to_another_process(watcher):
    me = psutil.Process()
    reused = ProcessIdentity(pid=me.pid, start_time=me.create_time() - 100)
    seen = Recorder()
    watcher.watch(reused, seen)
    assert wait_until(seen.identities, timeout=5) == [reused]


def test_many_runs_watched_from_many_threads_each_reported_once(spawn, watcher):
    seen = Recorder()
    runs = [spawn(argv=["sleep", "60"]) for _ in range(20)]
    threads = [threading.Thread(target=watcher.watch, args=(i, seen)) for i, _ in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen.identities() == []
    for identity, _ in runs:
        wait_until(lambda identity=identity: group_names(identity) == ["sh", "sleep"])
        assert signal_group(identity, signal.SIGTERM)
    wait_until(lambda: len(seen.identities()) == 20)
    assert sorted(seen.identities(), key=lambda i: i.pid) == sorted((i for i, _ in runs), key=lambda i: i.pid)
    for _, run_dir in runs:
        assert read_exit(run_dir) == ExitRecord(exit_code=143, signal=15)


def test_a_failing_callback_does_not_stop_the_watcher(spawn, watcher):
    def boom(identity: ProcessIdentity) -> None:
        raise RuntimeError("callback bug")

    first, _run_dir = spawn(argv=["true"])
    watcher.watch(first, boom)
    second, _ = spawn(argv=["true"])
    seen = Recorder()
    watcher.watch(second, seen)
    assert wait_until(seen.identities) == [second]


def test_watch_after_close_is_refused():
    w = ExitWatcher()
    w.close()
    w.close()  # idempotent
    me = psutil.Process()
    with pytest.raises(RuntimeError):
        w.watch(ProcessIdentity(me.pid, me.create_time()), lambda i: None)


ADOPT_SCRIPT = """
import json, pathlib, sys
from reconciler.agent.process import spawn_run
cwd, run_dir = sys.argv[1], pathlib.Path(sys.argv[2])
wrapper = pathlib.Path(sys.argv[3]) if sys.argv[3] else None
identity = spawn_run(argv=["sh", "-c", "read x < ./gate; exit 5"], env={}, cwd=cwd, run_dir=run_dir, wrapper=wrapper)
print(json.dumps({"pid": identity.pid, "start_time": identity.start_time}))
"""


def test_adopted_run_is_reported_and_its_exit_code_read(watcher, tmp_path, wrapper):
    os.mkfifo(tmp_path / "gate")
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    spawner = subprocess.run(
        [sys.executable, "-c", ADOPT_SCRIPT, str(tmp_path), str(run_dir), str(wrapper or "")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    identity = ProcessIdentity(**json.loads(spawner.stdout))
    try:
        # The spawner is gone: the wrapper lives on, and is not our child.
        assert is_alive(identity)
        assert psutil.Process(identity.pid).ppid() != os.getpid()
        seen = Recorder()
        watcher.watch(identity, seen)
        (tmp_path / "gate").write_text("go\n")
        assert wait_until(seen.identities) == [identity]
        assert read_exit(run_dir) == ExitRecord(exit_code=5, signal=None)
        assert not is_alive(identity)
    finally:
        signal_group(identity, signal.SIGKILL)
        wait_until(lambda: not group_alive(identity))


def test_a_spawned_run_is_watched_before_its_start_time_is_read(spawn, fork_server):
    """Watching a run just spawned asks nothing of /proc (the pid is the child's until it is
    reaped); the watcher reads the start time before it reaps, and calls back with it. The run
    ends by itself: a signal sent this soon after the spawn can land in the sh wrapper's window
    before the command's exec, where it is absorbed (wrapper.py), and the run would go on."""
    identity, run_dir = spawn(argv=["sleep", "0.3"])
    done = threading.Event()
    seen = Recorder()

    def exited(ident: ProcessIdentity) -> None:
        seen(ident)
        done.set()

    with ExitWatcher() as w:
        w.watch(identity, exited)
        # watched without a look at /proc (a fork server's reply carries the start time)
        assert identity.start_known == (fork_server is not None)
        assert done.wait(10)
    assert seen.identities() == [identity]
    assert identity.start_known  # read before the reap
    assert read_exit(run_dir) == ExitRecord(exit_code=0, signal=None)
