"""The artifact cache: a job's zip fetched under the state dir once per sha256 (artifacts.py
unpacks it into a fresh folder per run, beside the reconcile loop).

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
past the limit, not a zip, a member the rules of unzip.py refuse) are not."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from ..files import make_private_dirs
from .unzip import ArtifactError

CACHE = "artifacts"  # the cache's folder under the state dir, beside runs/
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
        facts = os.fstat(src)
        if not stat.S_ISREG(facts.st_mode):  # before fdopen, which refuses a folder in words of its own
            os.close(src)
            raise ArtifactError(f"{shown(url)} is not a regular file")
        with os.fdopen(src, "rb") as source:
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
