"""Learning when run wrappers exit, without polling each one.

A pidfd (Linux >= 5.3) becomes readable when its process exits, whether or
not the process is our child, so the same mechanism covers runs we spawned
and runs adopted after a restart (whose wrappers now belong to init). One
thread waits on all pidfds through one selector: the cost of a tick is the
number of runs that ended, not the number of runs watched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
from collections.abc import Callable

from reconciler.agent.identity import ProcessIdentity, is_alive
from reconciler.agent.process import reap
from reconciler.threads import critical

log = logging.getLogger(__name__)

Callback = Callable[[ProcessIdentity], None]


class ExitWatcher:
    """Calls callback(identity) from one background thread when a watched process exits.

    The callback runs after the process was reaped (when it was our child), at
    most once per watch() call, and should be quick (e.g. enqueue a key):
    a slow callback delays every other notification. Each watched process
    holds one file descriptor until it exits, which counts against
    RLIMIT_NOFILE.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (identity, callback, pidfd or None when already dead), handed to the thread
        self._pending: list[tuple[ProcessIdentity, Callback, int | None]] = []
        self._closed = False
        # Self-pipe: watch() writes a byte so select() returns and picks up new pidfds;
        # registering from another thread while select() runs is not safe in Python.
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = critical("exit-watcher", self._run)
        self._thread.start()

    def watch(self, identity: ProcessIdentity, callback: Callback) -> None:
        """Call callback(identity) once the process has exited (promptly if it already has).

        Raises OSError (e.g. EMFILE: out of file descriptors) if the process
        cannot be watched, and RuntimeError after close().
        """
        try:
            pidfd: int | None = os.pidfd_open(identity.pid)
        except ProcessLookupError:
            pidfd = None
        # Check the identity only after opening: if it matches now, the pidfd
        # cannot refer to an older holder of the pid (two live processes never
        # share a pid). A mismatch means pid reuse: ours is long gone. A child whose
        # start time is not read yet is not reaped yet: the pid is still its own.
        if pidfd is not None and identity.start_known and not is_alive(identity):
            # A zombie also lands here; the thread still reaps it before calling back.
            os.close(pidfd)
            pidfd = None
        with self._lock:
            if self._closed:
                if pidfd is not None:
                    os.close(pidfd)
                raise RuntimeError("ExitWatcher is closed")
            self._pending.append((identity, callback, pidfd))
            self._wake()

    def close(self) -> None:
        """Stop the thread; watches not yet reported are dropped without a callback."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> ExitWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        # Called with the lock held, so it never races _shutdown closing the pipe.
        if self._wake_w < 0:
            return
        with contextlib.suppress(BlockingIOError):  # the pipe is full, so a wake-up is already pending
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        try:
            while self._step():
                pass
        finally:
            self._shutdown()

    def _step(self) -> bool:
        for key, _ in self._selector.select():
            if key.data is None:
                self._drain_wake_pipe()
                continue
            self._selector.unregister(key.fd)
            os.close(key.fd)
            self._finish(*key.data)
        with self._lock:
            if self._closed:
                return False
            pending, self._pending = self._pending, []
        for identity, callback, pidfd in pending:
            if pidfd is None:
                self._finish(identity, callback)
            else:
                self._selector.register(pidfd, selectors.EVENT_READ, (identity, callback))
        return True

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _finish(self, identity: ProcessIdentity, callback: Callback) -> None:
        try:
            reap(identity)  # our child: collect it so no zombie stays
        except Exception:
            log.exception("reaping %s failed", identity)
        try:
            callback(identity)
        except Exception:
            log.exception("exit callback for %s failed", identity)

    def _shutdown(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, []
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        for _, _, pidfd in pending:
            if pidfd is not None:
                os.close(pidfd)
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                os.close(key.fd)
        self._selector.close()
