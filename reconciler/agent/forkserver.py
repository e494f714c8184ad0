"""The fork server: the C wrapper run once per agent as a process that starts every run as a
forked copy of itself (`reconciler-run.c`, `serve`), so that a start costs the agent's thread
one request and one short reply instead of a fork and exec of its own, and no run pays the
wrapper's exec (issue 15, "a cheaper start").

A copy is the run's wrapper as an exec'd one is: it leads its own session, writes the run's
logs and exit record, and outlives the server and the agent. The server replies with the
copy's pid and start time right after the fork; the copy calls setsid first (a signal to its
group waits for that: `groups.settle`) and has the signals it traps blocked from the fork
until they are trapped, so none can kill it before it records. The server holds no run's
state: a server that dies while idle loses nothing, and the next request starts another.

A request written without a good reply is a start whose outcome is unknown: the server may
have forked the copy (it was killed after the fork, or stalled past the timeout, or the reply
could not be read). It is never taken for "nothing started": `ForkServerUnsure` is raised, the
server is ended, and the caller looks for the run (`LocalAgent.find`) before it starts it
again, as after a crash.

Crash safety: an agent killed after writing a request may leave its server forking the run
after the next agent looked for it and, finding nothing, started it again. So each server
holds an flock on a file of its own under `STATE/forkservers/`, named after the agent's
process, and each copy holds it too until it leads its session under the wrapper's title
(`reconciler-run.c`); `wait_for_servers` waits for the locks of agents that are gone, and
of this agent's own servers ended before, so every run asked of them is findable.
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

from reconciler.agent.identity import ProcessIdentity, is_alive
from reconciler.agent.process import inherited_environment
from reconciler.agent.wrapper import WRAPPER_NAME

# Room in the server's command line for a copy's `-c - reconciler-run RUN_DIR` (its argv[0],
# the binary's path, stays): a run dir is under the state folder, its name at most a job name
# (63), a uid (36) and a run number; the rest is margin.
TITLE_MARGIN = 300
ANSWER_TIMEOUT = 10.0  # to write a request, and for its reply (microseconds after the fork): a server gone wrong
MAX_REQUEST = 1 << 26  # as the server takes (reconciler-run.c); the kernel refuses far less at exec
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_servers = itertools.count(1)
# The lock files of the servers running in this process (several agents may share a state
# folder in one process): never waited for by `wait_for_servers`.
_live: set[Path] = set()
_live_lock = threading.Lock()
log = logging.getLogger(__name__)


class ForkServerError(OSError):
    """The server refused the request or could not be reached; nothing was started."""


class ForkServerUnsure(Exception):
    """The request was written and no good reply came: the run may have been started. Not a
    StartFailed: the caller looks for it (`LocalAgent.find`) before starting it again."""


class ForkServer:
    """One server process, started at the first request and again after it died."""

    def __init__(self, binary: Path, locks: Path, *, title_room: int = 4096 + TITLE_MARGIN):
        self.binary = binary
        self.locks = locks  # a private folder: the lock file of each server started
        self.title_room = title_room
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self.current: Path | None = None  # the lock file of the server running now

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
        """Fork a copy of the wrapper for `command`; its identity (pid and start time, read by
        the server right after the fork). Raises ForkServerError when nothing was started,
        ForkServerUnsure when that is not known."""
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
        if len(body) > MAX_REQUEST:
            raise ForkServerError(f"the command and its environment take {len(body)} bytes: too long")
        request = struct.pack("=I", len(body)) + body
        with self._lock:
            server = self._server()
            try:
                self._write(server, request)
            except BrokenPipeError:  # it died since: it read no whole request, forked nothing
                self._forget()
                server = self._server()
                self._write(server, request)
            try:
                line = self._reply(server)
                if line.startswith("!"):  # the server's own refusal (its fork failed): nothing forked
                    raise ForkServerError(line[1:].strip())
                pid, ticks = (int(word) for word in line.split())
            except ForkServerError:
                raise
            except BaseException as exc:  # written, and no good reply: it may have forked the copy
                self._forget()
                raise ForkServerUnsure(f"the run fork server gave no answer ({exc or type(exc).__name__})") from exc
        if not ticks:  # /proc could not be read: read at first use, as an exec'd wrapper's
            return ProcessIdentity.of_child(pid)
        return ProcessIdentity(pid, ticks / _CLOCK_TICKS + psutil.boot_time())

    def _write(self, server: subprocess.Popen[bytes], request: bytes) -> None:
        """The request whole, or TimeoutError: nothing forked (the server forks once it has
        read a whole request, and is ended before it can)."""
        try:
            _write_all(server.stdin.fileno(), request)  # type: ignore[union-attr]
        except TimeoutError as exc:
            self._forget()
            raise ForkServerError(f"the run fork server took no request ({exc})") from None

    def _server(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self._forget()
            me = psutil.Process()
            path = self.locks / f"{me.pid}-{me.create_time()}.{next(_servers)}.lock"
            # locked under another name first: a `wait_for_servers` meanwhile must not take an
            # unlocked file of this process's for an ended server's, and remove it
            making = path.with_suffix(".new")
            fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            if fd < 3:  # never 0-2: Popen gives the server its pipes there
                fd, low = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3), fd
                os.close(low)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: free; the server's from now on
                with _live_lock:
                    os.rename(making, path)
                    _live.add(path)
                self.current = path
                self._proc = subprocess.Popen(
                    [str(self.binary), "--serve", str(fd), f"{WRAPPER_NAME}-server", " " * self.title_room],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # a terminal's ^C is not its business, nor its copies'
                    close_fds=True,
                    pass_fds=(fd,),
                    # the agent's environment without reconciler's own: each copy's exec-time
                    # environment (/proc/PID/environ); a run's own is given with its request
                    env=inherited_environment(),
                )
            except BaseException:
                with _live_lock:
                    _live.discard(path)
                raise
            finally:
                os.close(fd)  # the lock stays with the server's copy of the descriptor
            os.set_blocking(self._proc.stdin.fileno(), False)  # type: ignore[union-attr]  # writes time out
        return self._proc

    def _reply(self, server: subprocess.Popen[bytes]) -> str:
        fd = server.stdout.fileno()  # type: ignore[union-attr]
        poller = select.poll()  # not select(): the agent may hold more than 1024 descriptors
        poller.register(fd, select.POLLIN)
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(fd, 4096) if poller.poll(ANSWER_TIMEOUT * 1000) else None
            if chunk is None:
                raise TimeoutError(f"no reply within {ANSWER_TIMEOUT:g}s")
            if not chunk:  # EOF: the server died, before its fork or after it
                raise EOFError("the server ended")
            data += chunk
        return data.decode()

    def _forget(self) -> None:
        """End the server and its group: it and a copy not yet in a session of its own."""
        proc, self._proc = self._proc, None
        self._not_live()
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def _not_live(self) -> None:
        """Its server is ending: from now on, `wait_for_servers` waits for its lock."""
        with _live_lock:
            if self.current is not None:
                _live.discard(self.current)
        self.current = None

    def close(self) -> None:
        """End the server (EOF on its input); its copies, the runs, go on."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._not_live()
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


def wait_for_servers(locks: Path, timeout: float = 10.0) -> bool:
    """True once every server under `locks` that may have forked a run nobody can find yet has
    ended, and each copy it forked leads its session under its title: those of agents that
    are gone and this process's own ended servers (those running now aside). A live agent's
    server is not waited for: the admissions it holds are its own (claimed with its owner),
    never this agent's to start. False after `timeout` seconds, said."""
    me = psutil.Process()
    mine = f"{me.pid}-{me.create_time()}."
    deadline = time.monotonic() + timeout
    try:
        paths = sorted(locks.iterdir())
    except FileNotFoundError:
        return True
    with _live_lock:
        live = set(_live)
    for path in paths:
        if path in live or not path.name.endswith(".lock"):
            continue
        if not path.name.startswith(mine) and not _owner_gone(path.name):
            continue
        while not _free(path):
            if time.monotonic() >= deadline:
                log.warning("the run fork server holding %s has not ended: a run it started may start again", path)
                return False
            time.sleep(0.005)
    return True


def _owner_gone(name: str) -> bool:
    """The agent process a lock file is named after (`PID-START.N.lock`) has exited."""
    owner = name.split(".", 2)
    try:
        pid, start = owner[0].split("-", 1)
        return not is_alive(ProcessIdentity(int(pid), float(f"{start}.{owner[1]}")))
    except (ValueError, IndexError):
        return True  # not a name this code made: waited for like a gone agent's


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
    """All of `data` to the non-blocking `fd` within ANSWER_TIMEOUT, else TimeoutError."""
    view = memoryview(data)
    deadline = time.monotonic() + ANSWER_TIMEOUT
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise TimeoutError(f"the request not taken within {ANSWER_TIMEOUT:g}s") from None
