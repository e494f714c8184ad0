"""The fork server: the C wrapper run once per agent as a process that starts every run as a
forked copy of itself (`reconciler-run.c`, `serve`), so that a start costs the agent's thread
one request and one short reply instead of a fork and exec of its own (issue 15, "a cheaper
start": the spawn off the reconcile thread, on the other core).

A copy is the run's wrapper exactly as an exec'd one is: it leads its own session, writes
the run's logs and exit record, and outlives the server and the agent; it answers the
request itself once its signals are trapped, so a signal sent to its group after the reply
is noted, never fatal. The server holds no run's state: its death loses nothing, and the
next request starts another.

Crash safety: a controller killed after writing a request may leave the server forking the
run after the next controller looked for it (`LocalAgent.find`) and, finding nothing, started
it again. So each server holds an flock on a file of its own under `locks/`, and each copy
holds it too until it leads its session under the wrapper's title (`reconciler-run.c`);
`wait_for_servers` returns once no lock but this agent's is held: every run asked of an
earlier server is then findable.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import select
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import psutil

from reconciler.agent.identity import ProcessIdentity
from reconciler.agent.process import inherited_environment
from reconciler.agent.wrapper import WRAPPER_NAME

# Room in the server's command line for a copy's `reconciler-run -c - reconciler-run RUN_DIR`
# (a run dir is a path: at most PATH_MAX).
_TITLE_ROOM = 4200
_REPLY_TIMEOUT = 30.0  # a copy answers microseconds after its fork; this is for a server gone wrong
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_servers = itertools.count(1)
log = logging.getLogger(__name__)


class ForkServerError(OSError):
    """The server could not be reached or did not answer; nothing was started."""


class ForkServer:
    """One server process, started at the first request and again after it died."""

    def __init__(self, binary: Path, locks: Path):
        self.binary = binary
        self.locks = locks  # a private folder: the lock file of each server started
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self.mine: set[Path] = set()  # lock files of servers this object started

    def start(
        self,
        *,
        run_dir: Path,
        fsync: bool,
        cgroups: str,
        address_space_kib: int | None,
        cwd: str,
        env: dict[str, str],
        command: list[str],
    ) -> ProcessIdentity:
        """Fork a copy of the wrapper for `command`; its identity (the server reads the copy's
        start time). Raises ForkServerError when nothing was started. The copy calls setsid
        first and has the signals it traps blocked until they are: a signal to its group
        waits for the setsid (groups.wait_armed), none can kill it before it records."""
        fields = [
            str(run_dir),
            "1" if fsync else "0",
            cgroups,
            "" if address_space_kib is None else str(address_space_kib),
            cwd,
        ]
        fields.append(str(len(env)))
        fields.extend(f"{k}={v}" for k, v in env.items())
        fields.extend(command)
        encoded = [os.fsencode(f) for f in fields]
        if any(b"\0" in f for f in encoded):  # as Popen refuses it: the fields are NUL-ended
            raise ForkServerError("embedded null byte in the command or its environment")
        body = b"".join(f + b"\0" for f in encoded)
        request = struct.pack("=I", len(body)) + body
        with self._lock:
            server = self._server()
            try:
                _write_all(server.stdin.fileno(), request)  # type: ignore[union-attr]
            except BrokenPipeError:  # it died since: nothing was forked; one more server
                self._forget()
                server = self._server()
                _write_all(server.stdin.fileno(), request)  # type: ignore[union-attr]
            line = self._reply(server)
        if line.startswith("!"):
            raise ForkServerError(line[1:].strip())
        pid, ticks = line.split()
        if ticks == "0":  # /proc could not be read: read at first use, as an exec'd wrapper's
            return ProcessIdentity.of_child(int(pid))
        return ProcessIdentity(int(pid), int(ticks) / _CLOCK_TICKS + psutil.boot_time())

    def _server(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            path = self.locks / f"{os.getpid()}.{next(_servers)}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: free; held by the server from now on
                self.mine.add(path)
                self._proc = subprocess.Popen(
                    [str(self.binary), "--serve", str(fd), f"{WRAPPER_NAME}-server", " " * _TITLE_ROOM],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # a terminal's ^C is not its business, nor its copies'
                    close_fds=True,
                    pass_fds=(fd,),
                    env=inherited_environment(),  # what `ps e` shows of each copy, as of an exec'd wrapper
                )
            finally:
                os.close(fd)  # the lock stays with the server's copy of the descriptor
        return self._proc

    def _reply(self, server: subprocess.Popen[bytes]) -> str:
        fd = server.stdout.fileno()  # type: ignore[union-attr]
        data = b""
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], _REPLY_TIMEOUT)
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:  # EOF: the server died before it forked (a copy holds the pipe open)
                self._forget()
                raise ForkServerError("the run fork server ended or did not answer")
            data += chunk
        return data.decode()

    def _forget(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # its group: the server, a copy not yet in its own
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        """End the server (EOF on its input); its copies, the runs, go on."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def wait_for_servers(locks: Path, mine: set[Path], timeout: float = 10.0) -> bool:
    """True once every server under `locks` but `mine` (those of an agent that died) has ended
    and each run it forked leads its session under its title; False after `timeout` seconds
    (a server of another agent still alive on this state folder), said once."""
    deadline = time.monotonic() + timeout
    for path in sorted(locks.glob("*.lock")):
        if path in mine:
            continue
        while not _free(path):
            if time.monotonic() >= deadline:
                log.warning("the run fork server holding %s has not ended: a run it started may start again", path)
                return False
            time.sleep(0.005)
    return True


def _free(path: Path) -> bool:
    """No process holds the lock of `path` (which is then removed), or it is gone."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
