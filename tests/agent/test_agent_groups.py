"""Stopping a run's whole process group, with real processes."""

from __future__ import annotations

import os
import signal

import psutil

from reconciler.agent.process import (
    ExitRecord,
    group_alive,
    group_pids,
    is_alive,
    kill_group_except_wrapper,
    read_exit,
    signal_group,
)

from .conftest import group_names, wait_until


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped (init here does not reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigterm_ignoring_run_survives_term_and_dies_by_kill(spawn, tmp_path):
    # The shell records that TERM arrived (so we know it was delivered) and carries on;
    # its child ignores TERM outright, as in `trap "" TERM; sleep 60`.
    identity, run_dir = spawn(
        shell='trap "echo > got_term" TERM; (trap "" TERM; exec sleep 60) & '
        "while :; do wait $!; [ -e got_term ] && break; done; wait $!"
    )
    # wrapper, the user's sh, and sleep (the subshell exec'd it)
    wait_until(lambda: group_names(identity) == ["sh", "sh", "sleep"])
    members = group_pids(identity)
    assert signal_group(identity, signal.SIGTERM)
    wait_until(lambda: (tmp_path / "got_term").exists())
    assert set(group_pids(identity)) == set(members)  # nobody died of TERM
    assert read_exit(run_dir) is None

    assert kill_group_except_wrapper(identity) == 2  # the user's sh and sleep, not the wrapper
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(exit_code=137, signal=9)
    wait_until(lambda: not group_alive(identity))
    assert all(gone(pid) for pid in members)


def test_trap_ignore_term_sleep(spawn):
    identity, run_dir = spawn(argv=["sh", "-c", 'trap "" TERM; sleep 60'])
    wait_until(lambda: group_names(identity) == ["sh", "sh", "sleep"])
    assert signal_group(identity, signal.SIGTERM)
    # A signal whose disposition is "ignore" is discarded when sent, so there is
    # nothing to wait for: the group is intact right after kill() returns.
    assert len(group_pids(identity)) == 3
    assert kill_group_except_wrapper(identity) == 2
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(exit_code=137, signal=9)
    wait_until(lambda: not group_alive(identity))


def test_wrapper_outlives_other_catchable_signals(spawn):
    identity, run_dir = spawn(argv=["sleep", "60"])
    wait_until(lambda: group_names(identity) == ["sh", "sleep"])
    assert signal_group(identity, signal.SIGUSR1)  # kills sleep (default action)
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(exit_code=128 + signal.SIGUSR1, signal=signal.SIGUSR1)


def test_stop_right_after_spawn_always_leaves_an_exit_record(spawn):
    # spawn_run returns only once the wrapper's traps are armed, so an immediate
    # stop can no longer kill the wrapper before it records. (The TERM itself may
    # be absorbed before the program exec's: the SIGKILL step then ends it.)
    for _ in range(20):
        identity, run_dir = spawn(argv=["sleep", "60"])
        assert signal_group(identity, signal.SIGTERM)

        def stopped(identity=identity, run_dir=run_dir):
            kill_group_except_wrapper(identity)  # what the controller does after the grace
            return read_exit(run_dir)

        record = wait_until(stopped)
        assert record in (ExitRecord(143, 15), ExitRecord(137, 9))
        wait_until(lambda identity=identity: not group_alive(identity))


def test_grandchildren_die_with_the_group(spawn):
    identity, run_dir = spawn(argv=["sh", "-c", "sleep 60 & sleep 60 & wait"])
    wait_until(lambda: group_names(identity) == ["sh", "sh", "sleep", "sleep"])
    members = group_pids(identity)
    sleeps = [p for p in members if psutil.Process(p).name() == "sleep"]
    assert len(sleeps) == 2
    assert signal_group(identity, signal.SIGTERM)
    wait_until(lambda: all(gone(pid) for pid in members if pid != identity.pid))
    assert wait_until(lambda: read_exit(run_dir)) == ExitRecord(exit_code=143, signal=15)
    wait_until(lambda: not group_alive(identity))
    assert all(gone(pid) for pid in sleeps)


def test_grandchild_outliving_its_parent_keeps_the_group_alive(spawn):
    # The run's main process exits at once; its background child is still the run's.
    identity, run_dir = spawn(shell="sleep 60 & exit 0")
    assert wait_until(lambda: read_exit(run_dir)).exit_code == 0
    wait_until(lambda: not is_alive(identity))  # the wrapper is done ...
    assert group_alive(identity)  # ... but the group is not
    (orphan,) = group_pids(identity)
    assert psutil.Process(orphan).name() == "sleep"
    assert kill_group_except_wrapper(identity) == 1
    wait_until(lambda: not group_alive(identity))


def test_signalling_a_finished_run_does_nothing(spawn):
    identity, run_dir = spawn(argv=["true"])
    wait_until(lambda: read_exit(run_dir))
    wait_until(lambda: not group_alive(identity))
    assert group_pids(identity) == []
    assert not signal_group(identity, signal.SIGTERM)
    assert kill_group_except_wrapper(identity) == 0


def test_group_of_a_reused_pid_is_not_ours():
    # Our own pid with another start time: the "run" is long gone; never signal this group.
    me = psutil.Process()
    from reconciler.agent.process import ProcessIdentity

    stranger = ProcessIdentity(pid=os.getpid(), start_time=me.create_time() - 100)
    assert group_pids(stranger) == []
    assert not signal_group(stranger, 0)
