"""Keeping run logs within the job's logLimit on disk while the runs write them.

A run writes its stdout and stderr files itself (they are its wrapper's stdout and stderr,
opened O_APPEND), and runs outlive the controller, so no reader sits on a pipe to cap them.
Instead one thread (`LogTrimmer`) looks at every live run's files once a second and drops
their heads, newest bytes kept, the way the kubelet rotates container logs.

How a head is dropped: fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) over the whole
blocks before the newest `limit` bytes. The file keeps its size, so the writer's appends go
on at its end untouched, and the head's blocks are freed: the disk holds about `limit` bytes
while the apparent size grows. Nothing of the newest `limit` bytes is touched and no byte is
copied; readers skip the hole (SEEK_DATA, see logs.py).

A filesystem that refuses holes, or punches them without reporting them to SEEK_DATA (a
reader would print their NUL bytes), gets logrotate's copytruncate instead: once the file passes
limit/2, its newest limit/2 bytes are copied to `stdout.1` (replacing the older part) and the
file is truncated, where the writer's O_APPEND makes it go on at offset 0. What is written
between the end of the copy and the truncation is lost, and between limit/2 and limit newest
bytes are kept.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from ..threads import critical
from .logs import data_start, rotated

log = logging.getLogger(__name__)

INTERVAL = 1.0  # how often the live runs' logs are looked at
STREAMS = ("stdout", "stderr")

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
# what a filesystem without holes answers (EINVAL: some FUSE and network filesystems)
_NO_HOLES = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
_COPY_BLOCK = 1024 * 1024

_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = getattr(_libc, "fallocate64", None) or _libc.fallocate  # a 64-bit offset on every ABI
_fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_fallocate.restype = ctypes.c_int


def punch_head(path: Path, length: int, size: int) -> None:
    """Free the first `length` bytes of a file (a multiple of its block size), keeping its
    size. Raises OSError, with EOPNOTSUPP where the holes would not show to readers."""
    # fallocate wants a descriptor open for writing; O_WRONLY alone neither truncates the
    # file nor touches the writer's offset
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, 0, length) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(path))
        if data_start(fd, 0, size) < length:
            raise OSError(errno.EOPNOTSUPP, "the filesystem does not report holes to SEEK_DATA", str(path))
    finally:
        os.close(fd)


def copy_truncate(path: Path, limit: int) -> None:
    """logrotate's copytruncate: the newest limit/2 bytes (and whatever arrives while they
    are copied) to `path.1`, then `path` truncated to nothing."""
    older = rotated(path)
    spare = older.with_name(older.name + ".new")
    with open(path, "rb") as src:
        src.seek(max(0, os.fstat(src.fileno()).st_size - limit // 2))
        with open(os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "wb") as dst:
            shutil.copyfileobj(src, dst, _COPY_BLOCK)
            os.truncate(path, 0)  # at once: what is written from the copy's end to here is lost
    os.replace(spare, older)


@dataclass
class _LogFile:
    path: Path
    holes: bool  # punch holes; False once the filesystem refused them: copytruncate
    punched: int = 0  # bytes of its head known to be a hole
    failed: bool = False  # an error was logged already (once a file is enough)

    def trim(self, limit: int) -> None:
        info = os.stat(self.path)
        if self.holes:
            if info.st_size - self.punched - limit < info.st_blksize:
                return  # not a whole block over: nothing to free
            cut = (info.st_size - limit) // info.st_blksize * info.st_blksize
            try:
                punch_head(self.path, cut, info.st_size)
            except OSError as exc:
                if exc.errno not in _NO_HOLES:
                    raise
                self.holes = False
            else:
                self.punched = cut
                return
        if info.st_size > limit // 2:  # with the older part's limit/2, the two keep about `limit`
            copy_truncate(self.path, limit)


@dataclass
class _Run:
    limit: int
    files: list[_LogFile]
    over: bool = False  # the run ended: one last trim, then it is forgotten


class LogTrimmer:
    """Keeps the logs of the runs it is given within their limits, from one thread that
    looks at all of them every `interval` seconds. `holes=False` is what a filesystem
    without holes gets (copytruncate from the start)."""

    def __init__(self, interval: float = INTERVAL, *, holes: bool = True) -> None:
        self._interval = interval
        self._holes = holes
        self._runs: dict[Path, _Run] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = critical("log-trimmer", self._loop)
        self._thread.start()

    def keep(self, run_dir: Path, limit: int) -> None:
        """Keep this run's stdout and stderr within `limit` bytes each from now on (called
        again, with a new limit)."""
        with self._lock:
            run = self._runs.get(run_dir)
            if run is None:
                self._runs[run_dir] = _Run(limit, [_LogFile(run_dir / s, self._holes) for s in STREAMS])
            else:
                run.limit = limit

    def release(self, run_dir: Path) -> None:
        """The run is over: trim its logs once more (what it wrote since the last look), then
        forget it."""
        with self._lock:
            if (run := self._runs.get(run_dir)) is not None:
                run.over = True

    def __contains__(self, run_dir: Path) -> bool:
        with self._lock:
            return run_dir in self._runs

    def sweep(self) -> None:
        """One look at every run's logs."""
        with self._lock:
            runs = list(self._runs.items())
        for run_dir, run in runs:
            over = run.over  # read before the trim, so that it covers all the run wrote
            for file in run.files:
                try:
                    file.trim(run.limit)
                except FileNotFoundError:
                    pass  # removed by hand, or not created yet
                except OSError:
                    if not file.failed:
                        file.failed = True
                        log.warning("cannot keep %s within %d bytes", file.path, run.limit, exc_info=True)
                if self._holes and not file.holes:
                    self._holes = False  # run dirs share one filesystem: the next runs start with copytruncate
                    log.warning("%s: the filesystem keeps no holes; run logs are bounded by copytruncate", file.path)
            if over:
                with self._lock:
                    self._runs.pop(run_dir, None)

    def close(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.sweep()
