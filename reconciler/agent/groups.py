"""Non-blocking primitives on a run's process group.

A run's wrapper leads its own process group (pgid == wrapper pid), and every
process the run starts stays in it unless it moves itself out (setsid, a
daemon). Stopping a run is therefore a few calls the controller spreads over
its ticks, never a blocking sleep:

    signal_group(identity, SIGTERM)          # ask everyone, wrapper survives it
    ... stopGracePeriod later, on a timer ...
    kill_group_except_wrapper(identity)      # wrapper then records 137 in `exit`
    ... when group_pids(identity) == [identity.pid] for a while ...
    signal_group(identity, SIGKILL)          # last resort: no exit record then
"""

from __future__ import annotations

import os
import select
import threading
import time

import psutil

from reconciler.agent.identity import ProcessIdentity, same_process

# Wrappers whose traps may not be armed yet: pid -> the read end of the pipe that
# reaches EOF once they are (see spawn_run). Spawning returns without waiting, which
# keeps a sh startup off the reconcile loop's path; only a signal must wait for it.
_arming: dict[int, int] = {}
# Wrappers a fork server forked (forkserver.py) that may not lead their own session yet: their
# signals are blocked until trapped, so only their `setsid` is waited for.
_settling: set[int] = set()
_arming_lock = threading.Lock()


def arming(pid: int, ready_r: int) -> None:
    """Note a freshly spawned wrapper whose traps are not armed yet."""
    with _arming_lock:
        stale = _arming.pop(pid, None)  # a reused pid whose wrapper nobody waited on
        _arming[pid] = ready_r
    if stale is not None:
        os.close(stale)


def settling(pid: int) -> None:
    """Note a wrapper just forked by the fork server, which calls setsid first thing."""
    with _arming_lock:
        _settling.add(pid)


def wait_armed(pid: int, timeout: float = 5.0) -> None:
    """Return once the wrapper `pid` can no longer be killed by a signal before it records
    its exit (at once for wrappers not spawned by this process, or armed long ago). EOF on
    the pipe means its traps are set; the timeout only guards against a process forked
    (without exec) elsewhere in this program inheriting the pipe."""
    deadline = time.monotonic() + timeout
    settle(pid, timeout)
    with _arming_lock:
        ready_r = _arming.pop(pid, None)
    if ready_r is None:
        return
    try:
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([ready_r], [], [], left)
            if readable and not os.read(ready_r, 4096):
                return
    finally:
        os.close(ready_r)


def settle(pid: int, timeout: float = 5.0) -> None:
    """Return once a fork server's wrapper `pid` leads its own session (its group is there
    to look at and signal) or is gone; at once for any other process."""
    with _arming_lock:
        if pid not in _settling:
            return
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.getsid(pid) == pid:
                break
        except ProcessLookupError:
            break
        if time.monotonic() >= deadline:
            return  # left noted: a later look waits again
        time.sleep(0.0001)
    with _arming_lock:  # forgotten only once settled: a look from another thread meanwhile waited too
        _settling.discard(pid)


def _group_is_ours(identity: ProcessIdentity) -> bool:
    # The kernel never hands out a pid that is still some group's pgid, so if
    # the leader's pid now belongs to another process, our group has emptied
    # and the pid was reused. If the leader is gone, the members that remain
    # are ours (barring a full pid wrap-around whose new leader also died).
    try:
        psutil.Process(identity.pid)
    except psutil.NoSuchProcess:
        return True
    return same_process(identity)


def _members(identity: ProcessIdentity) -> list[psutil.Process]:
    pgid = identity.pid
    settle(pgid)
    try:
        os.killpg(pgid, 0)  # one syscall answers the common "all gone" case
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # someone else's processes are in it; let the scan decide
    if not _group_is_ours(identity):
        return []
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:  # a syscall, cheaper than reading /proc
                continue
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def group_pids(identity: ProcessIdentity) -> list[int]:
    """Pids of the run's live (non-zombie) group members, wrapper included.

    Scans the process table (about a syscall per process on the machine).
    Processes that left the group (setsid, double-forking daemons) are not
    seen: they escape the run, as they would under any process supervisor.
    """
    return [proc.pid for proc in _members(identity)]


def group_alive(identity: ProcessIdentity) -> bool:
    """True while any non-zombie process remains in the run's process group."""
    return bool(_members(identity))


def signal_group(identity: ProcessIdentity, sig: int) -> bool:
    """killpg(sig) to the run's group if it is still alive and still ours.

    Returns whether a signal was sent. The wrapper catches TERM, INT and HUP
    (it must live to record the status); the run's own processes get the
    default action unless they changed it. SIGKILL here also kills the
    wrapper, so no exit code gets recorded: prefer kill_group_except_wrapper.
    A signal sent within about a millisecond of the wrapper being armed may be
    absorbed by the not-yet-exec'd child (see wrapper.py): a stop must always
    be followed by the SIGKILL step if the group outlives the grace period.
    """
    if not _members(identity):
        return False
    wait_armed(identity.pid)
    try:
        os.killpg(identity.pid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_group_except_wrapper(identity: ProcessIdentity) -> int:
    """SIGKILL every live member of the run's group except the wrapper.

    The wrapper then reaps its child and records 137 (128 + SIGKILL) in
    `exit`. Returns how many processes were signalled. One pass, no waiting:
    a process forked after the scan survives it, so call again while
    group_pids(identity) holds more than the wrapper. If only the wrapper
    remains, alive and childless, for a while (it should exit within
    milliseconds), the caller may signal_group(identity, SIGKILL).
    """
    killed = 0
    wait_armed(identity.pid)
    for proc in _members(identity):
        if proc.pid == identity.pid:
            continue
        try:
            proc.kill()  # psutil refuses if the pid was reused since the scan
            killed += 1
        except psutil.NoSuchProcess:
            continue
    return killed


__all__ = ["arming", "group_alive", "group_pids", "kill_group_except_wrapper", "signal_group", "wait_armed"]
