"""A job's artifact: a zip fetched into a cache under the state dir (once per sha256) and
unpacked into a fresh folder per run, beside the reconcile loop.

The cache (`STATE/artifacts/`, beside `runs/`, owner-only):
- `sha256/<hex>.zip`: one copy per content, whatever URLs it came from; a file is renamed
  into place only once complete, fsynced and (when the spec gives one) checked against its
  sha256, so what is there is trusted without being read again;
- `url/<sha256 of the URL>.json`: for an artifact without a sha256, which content its URL
  gave last and how to tell whether it changed: a file:// source's size, mtime and inode
  (read again when one changed), an http(s) answer's ETag and Last-Modified (asked again
  with If-None-Match / If-Modified-Since on every run; a 304 reuses the copy; a server that
  gives neither is fetched again for every run);
- `locks/<key>.lock`: one per cache entry, held (flock) while the entry is looked at and
  fetched, so that concurrent runs, in this process or another (two controllers on one
  state dir), fetch it once: the second finds the first's copy when it gets the lock;
- `tmp/<key>.*.part`: a download in progress. A crash leaves one behind; whoever holds the
  entry's lock next removes it (its writer is gone: the lock was free).

Failing to get the bytes (no connection, a timeout, a status other than 200, a missing
local file, a transfer cut short) is retryable; bytes that are wrong (a checksum, a size
past the limit, not a zip, a member the rules of unzip.py refuse) are not.

`Artifacts` runs this in a few threads of its own (fetches, then unpacking and removal), so
a step of the reconcile loop only asks and never waits: `prepare` answers at once (started,
pending, ready, failed) and the job is woken when its preparation ends."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import queue
import stat
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from ..files import make_private_dirs
from ..threads import critical
from .logs import WORK
from .unzip import TEMP_PREFIX, ArtifactError, UnpackLimits, remove_tree, unpack

log = logging.getLogger(__name__)

CACHE = "artifacts"  # the cache's folder under the state dir, beside runs/
FETCH_THREADS = 4  # downloads at once; more wait their turn
DISK_THREADS = 2  # unpacking and removing run folders
CLOSE_TIMEOUT = 5.0  # how long close() carries out the removals still queued
_BLOCK = 64 * 1024


@dataclass(frozen=True)
class FetchLimits:
    size: int = 2**30  # bytes of one zip
    connect: float = 10.0  # seconds to connect
    read: float = 30.0  # seconds without a byte
    seconds: float = 3600.0  # one whole transfer


@dataclass(frozen=True)
class _Fetched:
    temp: Path
    digest: str
    source: list[int] | None = None  # a file:// source's size, mtime_ns, inode, device
    etag: str | None = None
    last_modified: str | None = None


_NOT_MODIFIED: Literal["not modified"] = "not modified"


def shown(url: str) -> str:
    """The URL as messages show it: a password in it as ***."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def file_path(url: str) -> str:
    """The local path of a file:// URL (file:///srv/app.zip, file://localhost/srv/app.zip)."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ArtifactError(f"{shown(url)}: a file:// URL must name a local file (no host but localhost)")
    path = urllib.parse.unquote(parts.path)
    if not path.startswith("/") or "\0" in path:
        raise ArtifactError(f"{shown(url)}: a file:// URL must name an absolute path")
    return path


class Cache:
    """Zips by content, fetched once per cache entry however many ask at once."""

    def __init__(self, root: Path, limits: FetchLimits | None = None):
        self.root = root
        self.limits = limits or FetchLimits()

    def content(self, sha256: str) -> Path:
        return self.root / "sha256" / f"{sha256}.zip"

    def get(self, url: str, sha256: str | None) -> Path:
        """The cached zip of this artifact, fetched (and verified) first when need be;
        raises ArtifactError."""
        for sub in ("sha256", "url", "locks", "tmp"):  # again each time: someone may clear the cache
            make_private_dirs(self.root / sub)
        key = f"sha256-{sha256}" if sha256 else f"url-{_digest(url)}"
        with self._locked(key):
            for stale in (self.root / "tmp").glob(f"{key}.*.part"):  # a crashed fetch's: the lock was free
                stale.unlink(missing_ok=True)
            if sha256 is None:
                return self._by_url(url, key)
            entry = self.content(sha256)
            if entry.is_file():
                return entry
            fetched = self._fetch(url, key, None)
            assert isinstance(fetched, _Fetched)  # no validators were sent: no 304
            if fetched.digest != sha256:
                fetched.temp.unlink(missing_ok=True)
                raise ArtifactError(f"sha256 mismatch: {shown(url)} has {fetched.digest}, the spec says {sha256}")
            return self._keep(fetched)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        # flock, not fcntl's POSIX locks: those are the process's, dropped when any of its
        # descriptors of the file closes, and not exclusive between its own threads
        fd = os.open(self.root / "locks" / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _by_url(self, url: str, key: str) -> Path:
        pointer_path = self.root / "url" / f"{key.removeprefix('url-')}.json"
        pointer = _read_pointer(pointer_path)
        known = self.content(str(pointer["sha256"])) if pointer else None
        if known is not None and not known.is_file():
            pointer, known = None, None
        if url.startswith("file://"):
            fetched = self._fetch(url, key, None, known=pointer)
        else:
            fetched = self._fetch(url, key, pointer if known is not None else None)
        if not isinstance(fetched, _Fetched):  # unchanged
            assert known is not None
            return known
        entry = self._keep(fetched)
        record = {
            "url": shown(url),
            "sha256": fetched.digest,
            "source": fetched.source,
            "etag": fetched.etag,
            "lastModified": fetched.last_modified,
        }
        _write_atomically(pointer_path, json.dumps(record).encode())
        return entry

    def _keep(self, fetched: _Fetched) -> Path:
        entry = self.content(fetched.digest)
        os.replace(fetched.temp, entry)
        return entry

    def _fetch(
        self, url: str, key: str, validators: dict[str, object] | None, *, known: dict[str, object] | None = None
    ) -> _Fetched | Literal["not modified"]:
        """Into a temporary file of the cache, fsynced; or _NOT_MODIFIED when `validators`
        (an http answer's) or `known` (a local file's facts) say the cached copy is current."""
        fd, temp = tempfile.mkstemp(prefix=f"{key}.", suffix=".part", dir=self.root / "tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                if url.startswith("file://"):
                    result = self._from_file(url, out, known)
                else:
                    result = self._from_http(url, out, validators)
                if isinstance(result, _Fetched):
                    out.flush()
                    os.fsync(out.fileno())  # on disk before it is renamed into the cache
        except BaseException:
            os.unlink(temp)
            raise
        if not isinstance(result, _Fetched):
            os.unlink(temp)
            return result
        return _Fetched(Path(temp), result.digest, result.source, result.etag, result.last_modified)

    def _from_file(
        self, url: str, out: BinaryIO, known: dict[str, object] | None
    ) -> _Fetched | Literal["not modified"]:
        path = file_path(url)
        try:
            # O_NONBLOCK: a FIFO would block the open until a writer came; refused below
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            raise ArtifactError(f"{shown(url)} is unreachable: {exc.strerror}", retryable=True) from exc
        with os.fdopen(src, "rb") as source:
            facts = os.fstat(src)
            if not stat.S_ISREG(facts.st_mode):
                raise ArtifactError(f"{shown(url)} is not a regular file")
            seen = [facts.st_size, facts.st_mtime_ns, facts.st_ino, facts.st_dev]
            if known is not None and known.get("source") == seen:
                return _NOT_MODIFIED
            self._too_large(url, facts.st_size)
            digest = self._copy(url, iter(lambda: source.read(_BLOCK), b""), out)
        return _Fetched(Path(), digest, source=seen)

    def _from_http(
        self, url: str, out: BinaryIO, validators: dict[str, object] | None
    ) -> _Fetched | Literal["not modified"]:
        import httpx  # here: its import is 65-135 ms of every controller's start otherwise

        # identity: a compressed answer would be inflated by httpx a chunk at a time, with no
        # bound on what one chunk becomes in memory
        headers = {"Accept-Encoding": "identity", "User-Agent": "reconciler"}
        if validators is not None:
            if isinstance(etag := validators.get("etag"), str):
                headers["If-None-Match"] = etag
            if isinstance(modified := validators.get("lastModified"), str):
                headers["If-Modified-Since"] = modified
        timeout = httpx.Timeout(self.limits.read, connect=self.limits.connect)
        try:
            with (
                httpx.Client(timeout=timeout, follow_redirects=True, max_redirects=5) as client,
                client.stream("GET", url, headers=headers) as answer,
            ):
                if answer.status_code == 304 and validators is not None:
                    return _NOT_MODIFIED
                if answer.status_code != 200:
                    raise ArtifactError(
                        f"{shown(url)} is unreachable: the server answered {answer.status_code} {answer.reason_phrase}",
                        retryable=True,
                    )
                encoding = answer.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise ArtifactError(f"{shown(url)}: the server sent it {encoding}-encoded, not as it is")
                length = answer.headers.get("content-length", "")
                if length.isdigit():
                    self._too_large(url, int(length))
                digest = self._copy(url, answer.iter_raw(), out)  # as received, up to 64 KiB a read
                return _Fetched(
                    Path(), digest, etag=answer.headers.get("etag"), last_modified=answer.headers.get("last-modified")
                )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise ArtifactError(f"{shown(url)} cannot be fetched: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ArtifactError(f"{shown(url)} is unreachable: {exc or type(exc).__name__}", retryable=True) from exc

    def _too_large(self, url: str, size: int) -> None:
        if size > self.limits.size:
            limit = self.limits.size
            raise ArtifactError(f"{shown(url)} is {size} bytes, more than {limit}, the limit for an artifact")

    def _copy(self, url: str, blocks: Iterable[bytes], out: BinaryIO) -> str:
        """Write the blocks, counting them against the size limit and the transfer's time."""
        digest = hashlib.sha256()
        size, deadline = 0, time.monotonic() + self.limits.seconds
        for block in blocks:
            size += len(block)
            if size > self.limits.size:
                raise ArtifactError(f"{shown(url)} is more than {self.limits.size} bytes, the limit for an artifact")
            if time.monotonic() > deadline:
                raise ArtifactError(
                    f"{shown(url)} is unreachable: the transfer took more than {self.limits.seconds:g}s", retryable=True
                )
            digest.update(block)
            out.write(block)
        return digest.hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _read_pointer(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    sha = data.get("sha256") if isinstance(data, dict) else None
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        return None
    return dict(data)


def _write_atomically(path: Path, data: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


# -- preparing runs beside the loop ------------------------------------------------------
@dataclass(frozen=True)
class Preparation:
    """Where a run's artifact stands. `started`: this call asked for it; `pending`: it is
    being fetched or unpacked; `ready`: unpacked into the run's folder; `failed`: with the
    message, the reason (ArtifactInvalid, or StartFailed when the machine is at fault) and
    whether a later attempt may succeed."""

    state: Literal["started", "pending", "ready", "failed"]
    message: str = ""
    reason: str = "ArtifactInvalid"
    retryable: bool = False


_STARTED, _PENDING, _READY = Preparation("started"), Preparation("pending"), Preparation("ready")
Source = tuple[str, str | None]  # (url, sha256): runs asking for the same one share a fetch
_DiskWork = tuple[Path, "_Prep | None", "Path | None"]  # (run dir, unpack this prep from this zip | remove)


@dataclass
class _Prep:
    job: str
    run_dir: Path
    result: Preparation | None = None


class Artifacts:
    """Fetches artifacts and unpacks them into runs' folders in threads of its own (started
    on first use), and wakes the job when its run's folder is ready or cannot be."""

    def __init__(
        self,
        state_dir: Path,
        wake: Callable[[str], None],
        *,
        fetch_limits: FetchLimits | None = None,
        unpack_limits: UnpackLimits | None = None,
    ):
        self.cache = Cache(Path(state_dir) / CACHE, fetch_limits)
        self.unpack_limits = unpack_limits or UnpackLimits()
        self._wake = wake
        self._lock = threading.Lock()
        self._runs: dict[Path, _Prep] = {}
        self._fetching: dict[Source, list[_Prep]] = {}  # in flight in this process, and who waits for it
        self._fetches: queue.SimpleQueue[Source | None] = queue.SimpleQueue()
        # one queue a disk thread, a run's work always on the same one: its folder's removal
        # and a later unpacking into it (a drained admission's run number comes back) never overlap
        self._disk: list[queue.SimpleQueue[_DiskWork | None]] = [queue.SimpleQueue() for _ in range(DISK_THREADS)]
        self._threads: list[threading.Thread] = []
        self._closed = False

    def prepare(self, job: str, run_dir: Path, url: str, sha256: str | None) -> Preparation:
        """Answers at once. A run's preparation starts on the first call; its end (ready or
        failed) is answered once, then forgotten."""
        with self._lock:
            prep = self._runs.get(run_dir)
            if prep is None:
                if self._closed:
                    return _PENDING
                self._start()
                prep = self._runs[run_dir] = _Prep(job, run_dir)
                source = (url, sha256)
                waiting = self._fetching.get(source)
                if waiting is None:
                    self._fetching[source] = [prep]
                    self._fetches.put(source)
                else:
                    waiting.append(prep)
                return _STARTED
            if prep.result is None:
                return _PENDING
            del self._runs[run_dir]
            return prep.result

    def preparing(self, run_dir: Path) -> bool:
        """A preparation of this run is known here and not yet answered ready or failed."""
        with self._lock:
            return run_dir in self._runs

    def discard(self, run_dir: Path) -> None:
        """The run is over, or will never start: forget its preparation and remove its
        unpacked folder (in the background: a folder may be large)."""
        with self._lock:
            prep = self._runs.pop(run_dir, None)
            if prep is None and not os.path.lexists(os.path.join(run_dir, WORK)):
                return  # the common case, a run without an artifact: one stat
            if not self._closed:
                self._start()
                self._disk_for(run_dir).put((run_dir, None, None))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop: fetches in flight are left to end by themselves (their threads are daemons),
        unpacking not begun is dropped (the next controller prepares again), and the
        removals of ended runs' folders still queued are carried out, for up to `timeout`
        seconds: a process that exits right after (`up`) would leave them behind."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            for _ in range(FETCH_THREADS if threads else 0):
                self._fetches.put(None)
            for disk in self._disk if threads else []:
                disk.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads[FETCH_THREADS:]:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _start(self) -> None:  # under the lock
        if not self._threads:
            self._threads = [critical(f"artifact-fetch-{i}", self._fetch_loop) for i in range(FETCH_THREADS)]
            self._threads += [
                critical(f"artifact-unpack-{i}", functools.partial(self._disk_loop, disk))
                for i, disk in enumerate(self._disk)
            ]
            for thread in self._threads:
                thread.start()

    def _fetch_loop(self) -> None:
        while (source := self._fetches.get()) is not None:
            path, failure = None, None
            try:
                path = self.cache.get(*source)
            except ArtifactError as exc:
                failure = Preparation("failed", str(exc), exc.reason, exc.retryable)
            except Exception as exc:  # a fetch that cannot run is a failed run, not a dead thread
                log.warning("fetching artifact %s failed", shown(source[0]), exc_info=True)
                failure = Preparation("failed", f"cannot fetch the artifact {shown(source[0])}: {exc}", "StartFailed")
            with self._lock:
                waiting = self._fetching.pop(source, [])
            for prep in waiting:
                if failure is not None:
                    self._done(prep, failure)
                else:
                    self._disk_for(prep.run_dir).put((prep.run_dir, prep, path))

    def _disk_for(self, run_dir: Path) -> queue.SimpleQueue[_DiskWork | None]:
        return self._disk[hash(run_dir) % len(self._disk)]

    def _disk_loop(self, disk: queue.SimpleQueue[_DiskWork | None]) -> None:
        while (item := disk.get()) is not None:
            run_dir, prep, archive = item
            if prep is None or archive is None:
                _clear(run_dir)
                continue
            with self._lock:
                if self._runs.get(run_dir) is not prep or self._closed:
                    continue  # discarded while its fetch ran, or stopping
            try:
                make_private_dirs(run_dir)
                _clear(run_dir)  # what an earlier attempt at this run left (a crash)
                unpack(archive, run_dir / WORK, self.unpack_limits)
                result = _READY
            except ArtifactError as exc:
                result = Preparation("failed", str(exc), exc.reason, exc.retryable)
            except Exception as exc:
                log.warning("unpacking an artifact into %s failed", run_dir, exc_info=True)
                result = Preparation("failed", f"cannot unpack the artifact: {exc}", "StartFailed")
            self._done(prep, result)

    def _done(self, prep: _Prep, result: Preparation) -> None:
        with self._lock:
            current = self._runs.get(prep.run_dir) is prep
            if current:
                prep.result = result
            closed = self._closed
        if not current:  # discarded meanwhile: nobody will start it
            _clear(prep.run_dir)
        elif not closed:
            self._wake(prep.job)


def _clear(run_dir: Path) -> None:
    """Remove a run's unpacked folder and any unpacking a crash interrupted."""
    try:
        with os.scandir(run_dir) as found:
            names = [e.name for e in found if e.name == WORK or e.name.startswith(TEMP_PREFIX)]
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        try:
            remove_tree(run_dir / name)
        except OSError:
            log.warning("cannot remove %s", run_dir / name, exc_info=True)
