"""Starting runs and learning how they ended: spawn, exit record, reaping.

The process-group primitives (signal_group, group_alive, ...) live in
`groups.py` and the identity in `identity.py`; both are re-exported here so
callers need one import.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reconciler.agent.groups import (
    arming,
    group_alive,
    group_pids,
    kill_group_except_wrapper,
    settling,
    signal_group,
    wait_armed,
)
from reconciler.agent.identity import ProcessIdentity, is_alive, same_process
from reconciler.agent.wrapper import wrapper_argv
from reconciler.files import make_private_dirs, read_small

if TYPE_CHECKING:
    from reconciler.agent.forkserver import ForkServer


@dataclass(frozen=True)
class ExitRecord:
    exit_code: int | None
    signal: int | None  # set when exit_code > 128 (shell convention: 128 + signal)
    # when the wrapper wrote it (the file's mtime): when the run ended; not part of what it says
    at: float | None = field(default=None, compare=False)


class StartFailed(Exception):
    """The run could not be started (no such program, no such working dir...).

    Nothing was spawned; the message is one human sentence for status.message.
    """


# Runs we spawned ourselves, by pid. Keeping the Popen objects means we reap
# through Popen.poll (so subprocess never reaps behind our back from its
# internal `_active` list, and no "still running" ResourceWarning is raised).
_children: dict[int, tuple[ProcessIdentity, subprocess.Popen[bytes]]] = {}
_children_lock = threading.Lock()


def _resolve(program: str, *, path_env: str, cwd: str) -> str:
    """Absolute path of an executable, as execvp would find it from `cwd`."""
    if "/" in program:
        candidate = os.path.join(cwd, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
        raise StartFailed(f"{program!r} does not exist or is not executable")
    # Relative PATH entries are relative to the run's cwd, not to ours.
    search = os.pathsep.join(os.path.join(cwd, p) for p in path_env.split(os.pathsep))
    found = shutil.which(program, path=search)
    if found is None:
        raise StartFailed(f"executable {program!r} not found in PATH")
    return os.path.abspath(found)


RESERVED_PREFIX = "RECONCILER_"  # reconciler's own variables: the store URL, the server, tokens


def inherited_environment() -> dict[str, str]:
    """The agent's environment as a run inherits it: without reconciler's own variables
    (`RECONCILER_*`: the store's URL and its password, the server, tokens), which are none
    of the run's business and would let it rewrite the store."""
    return {k: v for k, v in os.environ.items() if not k.startswith(RESERVED_PREFIX)}


def _open_private(path: pathlib.Path) -> int:
    # O_APPEND: the agent may append a line (e.g. "job timed out") to stderr
    # while the run still writes to it; neither overwrites the other.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # the file may have existed with wider permissions
    return fd


def spawn_run(
    *,
    argv: list[str] | None = None,
    shell: str | None = None,
    env: dict[str, str],
    cwd: str,
    run_dir: pathlib.Path,
    fsync_exit: bool = True,
    join: list[pathlib.Path] | None = None,
    address_space_kib: int | None = None,
    wrapper: pathlib.Path | None = None,
    server: ForkServer | None = None,
) -> ProcessIdentity:
    """Start a run under the wrapper (the C build `wrapper`, else the sh script) in a new
    session; return the wrapper's identity.

    Exactly one of `argv` (exec'd as is, no shell interpretation) or `shell`
    (run by `/bin/sh -c`). `env` is merged over `inherited_environment()`. stdout and stderr
    go to run_dir/stdout and run_dir/stderr (0600, run_dir 0700); the wrapper
    writes the exit code to run_dir/exit (fsynced unless `fsync_exit` is
    False, see wrapper.py for the cost); its argv names `run_dir` as given, made absolute
    but not resolved (the agent knows it again by that path). Before the command starts, the wrapper
    joins each file in `join` (the run's cgroup: its pid to a cgroup.procs, 0 to a tasks) and sets
    `ulimit -v address_space_kib` (the fallback where no cgroup can be made). The
    wrapper leads its own process
    group: pgid == pid. Raises StartFailed, without spawning anything, when the
    program or the working directory is missing. reap() (which ExitWatcher
    calls) collects the wrapper once it has exited. The identity's start time is read at
    its first use, not here (`ProcessIdentity.of_child`). With `server`, the C wrapper's fork
    server starts the run as a forked copy of itself instead (forkserver.py): the same
    wrapper, not this process's child, its start time known at once; it raises
    ForkServerUnsure (not StartFailed) when the request was written but not answered: the
    run may have started, and must be looked for before it is started again.
    """
    if (argv is None) == (shell is None):
        raise ValueError("exactly one of argv and shell must be given")
    if argv is not None and not argv:
        raise ValueError("argv must not be empty")
    if not os.path.isdir(cwd):
        raise StartFailed(f"working directory {cwd!r} does not exist")
    merged = {**inherited_environment(), **env}
    if argv is not None:
        program = _resolve(argv[0], path_env=merged.get("PATH", os.defpath), cwd=cwd)
        command = [program, *argv[1:]]
    else:
        assert shell is not None  # checked above: exactly one of the two
        command = ["/bin/sh", "-c", shell]

    run_dir = pathlib.Path(run_dir)
    fresh = True
    try:
        os.mkdir(run_dir, 0o700)  # the common case: a new run, its parent in place
    except FileNotFoundError:  # the state folder was deleted meanwhile: made again, private
        make_private_dirs(run_dir)
    except FileExistsError:  # a restart of this run: a leftover record would end it at once
        (run_dir / "exit").unlink(missing_ok=True)
        fresh = False
    os.chmod(run_dir, 0o700)  # mkdir's mode is masked by umask and not applied if it existed
    if server is not None:
        return _start_by_server(server, run_dir, fresh, fsync_exit, join, address_space_kib, cwd, merged, command)

    # The C wrapper makes a new run's log files itself (reconciler-run.c), off this thread;
    # the script is given them, and a run dir used before has its logs emptied here.
    out = None if wrapper is not None and fresh else _open_private(run_dir / "stdout")
    if out is not None:
        os.close(_open_private(run_dir / "stderr"))  # created here; the wrapper appends to it
    ready_r, ready_w = os.pipe()  # the wrapper's first stderr: EOF once its traps are armed
    try:
        popen = subprocess.Popen(
            wrapper_argv(
                run_dir.absolute(),  # not resolved here: LocalAgent resolved its state folder once
                command,
                fsync=fsync_exit,
                join=join,
                address_space_kib=address_space_kib,
                binary=wrapper,
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if out is None else out,
            stderr=ready_w,
            cwd=cwd,
            env=merged,
            start_new_session=True,  # own session and group: signal the whole run at once
            close_fds=True,
        )
    except OSError as exc:  # e.g. cwd vanished or is not searchable
        os.close(ready_r)
        raise StartFailed(f"cannot start run: {exc}") from exc
    finally:
        if out is not None:
            os.close(out)
        os.close(ready_w)
    # The wrapper re-points its stderr to the file right after setting its traps, which
    # closes the pipe's last write end. Signals sent through groups.py wait for that
    # (wait_armed); spawning does not, so the wrapper's startup stays off the caller's path.
    arming(popen.pid, ready_r)

    identity = ProcessIdentity.of_child(popen.pid)  # its start time read once its exec is done
    with _children_lock:
        _children[popen.pid] = (identity, popen)
    return identity


def _start_by_server(
    server: ForkServer,
    run_dir: pathlib.Path,
    fresh: bool,
    fsync: bool,
    join: list[pathlib.Path] | None,
    address_space_kib: int | None,
    cwd: str,
    env: dict[str, str],
    command: list[str],
) -> ProcessIdentity:
    if not fresh:  # the copy appends to the logs: a run dir used before has them emptied here
        os.close(_open_private(run_dir / "stdout"))
        os.close(_open_private(run_dir / "stderr"))
    try:
        identity = server.start(
            run_dir=run_dir.absolute(),  # not resolved here: LocalAgent resolved its state folder once
            fsync=fsync,
            cgroups=" ".join(str(p) for p in join or []),
            address_space_kib=address_space_kib,
            cwd=cwd,
            env=env,
            command=command,
        )
    except OSError as exc:
        raise StartFailed(f"cannot start run: {exc}") from exc
    settling(identity.pid)  # a signal to its group waits for its setsid
    return identity


MAX_EXIT_CODE = 255  # what a wrapper writes: the command's status, or 128 + the signal that ended it


def read_exit(run_dir: pathlib.Path) -> ExitRecord | None:
    """The exit record the wrapper left, or None while there is none (yet)."""
    text = read_small(os.path.join(run_dir, "exit"))
    if text is None:  # no run dir, or something else in its place
        return None
    if not text.endswith("\n"):
        return None  # not written yet (or lost to a machine crash without fsync_exit): no record
    try:
        code = int(text)
    except ValueError:
        return None
    if not 0 <= code <= MAX_EXIT_CODE:
        # not the wrapper's (the run can write its folder): no record, as for any other
        # text, rather than a number a status or an agent's report cannot hold
        return None
    try:  # the end's time, also of a run that ended while no controller was there to see it
        at: float | None = os.stat(os.path.join(run_dir, "exit")).st_mtime
    except OSError:
        at = None
    return ExitRecord(exit_code=code, signal=code - 128 if code > 128 else None, at=at)


def reap(identity: ProcessIdentity) -> int | None:
    """Collect the wrapper if it is our child and has exited, so no zombie stays.

    Non-blocking. Returns the wrapper's status like Popen.returncode (-N when
    killed by signal N) when it was collected now, else None. Adopted runs are
    not our children: their zombies are the (new) parent's business.
    """
    with _children_lock:
        entry = _children.get(identity.pid)
    if entry is not None and entry[0] == identity:
        identity.read_start_time()  # while the pid is still the child's: once reaped, it may be reused
        code = entry[1].poll()
        if code is not None:
            with _children_lock:
                _children.pop(identity.pid, None)
            wait_armed(identity.pid, timeout=0)  # closes the arming pipe if nobody waited on it
        return code
    wait_armed(identity.pid, timeout=0)  # a fork server's wrapper: forgets its setsid wait
    if not same_process(identity):  # never waitpid a pid that was reused
        return None
    try:
        pid, status = os.waitpid(identity.pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if pid else None


__all__ = [
    "ExitRecord",
    "ProcessIdentity",
    "StartFailed",
    "group_alive",
    "group_pids",
    "is_alive",
    "kill_group_except_wrapper",
    "read_exit",
    "reap",
    "signal_group",
    "spawn_run",
    "wait_armed",
]
