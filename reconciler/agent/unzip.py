"""Unpacking an artifact's zip into a run's folder, refusing whatever could land outside it
or exhaust the disk or the agent's memory.

The rules, each refused with ArtifactError (reason ArtifactInvalid, not retryable):
- not a zip (no end of central directory, a corrupt member, a CRC that does not match);
- a name that is absolute, holds a `..` part, a backslash or a NUL byte;
- a member that is neither a regular file, a folder nor a symbolic link (character or block
  device, FIFO, socket), an encrypted one, or one compressed other than stored or deflated
  (bzip2 and LZMA members decompress without a bound on memory in zipfile);
- a symbolic link whose target is absolute, leaves the folder, or goes through another link
  out of it (checked lexically first, then with realpath once every link exists), and any
  member below a symbolic link of the same archive;
- a name given twice (but folders);
- more than `entries` members, a central directory over `directory` bytes (read before
  zipfile builds its member list, whose memory would follow the directory's size), a member
  of at least `ratio_from` bytes that claims more than `ratio` times its compressed size, and
  more than `total` bytes in all: claimed by the headers, and counted as they are written,
  so a header that lies stops at the same bound.

Unpacking goes to a fresh temporary folder (`.work-*` beside the destination) renamed to
the destination once complete: a crash leaves a temporary folder, never a half-unpacked
destination. Files are 0600 (0700 when the archive marks them executable), folders 0700;
no set-id bit, owner or time is taken from the archive. Symbolic links are made last, so no
file is ever written through one."""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TEMP_PREFIX = ".work-"  # a folder being unpacked, beside its destination
_BLOCK = 64 * 1024
_ACCEPTED_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
# errors of this machine rather than of the archive: the run cannot start, whatever the zip
_LOCAL_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EMFILE, errno.ENFILE, errno.ENOMEM}
)


class ArtifactError(Exception):
    """A run's artifact cannot be had or used. `reason` is the run's and the job's reason:
    ArtifactInvalid, or StartFailed when this machine is at fault (a full disk);
    `retryable` when trying again later may succeed (the URL could not be reached)."""

    def __init__(self, message: str, *, retryable: bool = False, reason: str = "ArtifactInvalid"):
        super().__init__(message)
        self.retryable = retryable
        self.reason = reason


@dataclass(frozen=True)
class UnpackLimits:
    total: int = 4 * 2**30  # bytes of all members, claimed and as written
    entries: int = 100_000  # members, folders included
    ratio: int = 100  # uncompressed to compressed size, for a member of at least ratio_from bytes
    ratio_from: int = 2**20
    directory: int = 16 * 2**20  # bytes of the central directory
    link: int = 4096  # bytes of a symbolic link's target


Kind = Literal["dir", "file", "link"]


@dataclass(frozen=True)
class Entry:
    kind: Kind
    parts: tuple[str, ...]  # the path below the folder, one name a part
    info: zipfile.ZipInfo
    executable: bool = False

    @property
    def name(self) -> str:
        return self.info.orig_filename


def _refuse(name: str, why: str) -> ArtifactError:
    return ArtifactError(f"artifact member {name!r} {why}")


def entry_of(info: zipfile.ZipInfo, limits: UnpackLimits) -> Entry | None:
    """What one member is and where it goes (None for the folder itself, `./`); raises
    ArtifactError for a member the rules refuse."""
    name = info.orig_filename
    if "\0" in name:
        raise _refuse(name, "has a NUL byte in its name")
    if "\\" in name:
        raise _refuse(name, "has a backslash in its name (zip names use '/')")
    if name.startswith("/"):
        raise _refuse(name, "is an absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _refuse(name, "would land outside the folder ('..')")
    mode = info.external_attr >> 16
    kind = _kind(name, stat.S_IFMT(mode))
    if not parts:
        if kind != "dir":
            raise _refuse(name, "has no name")
        return None
    if info.flag_bits & 0x1:
        raise _refuse(name, "is encrypted")
    if kind != "dir" and info.compress_type not in _ACCEPTED_METHODS:
        raise _refuse(name, f"is compressed with method {info.compress_type}: only stored and deflated are accepted")
    if kind == "file" and info.file_size >= limits.ratio_from and info.file_size > limits.ratio * info.compress_size:
        ratio = info.file_size // max(1, info.compress_size)
        raise _refuse(name, f"has a compression ratio of {ratio}:1, above the limit of {limits.ratio}:1 (a zip bomb?)")
    if kind == "link" and info.file_size > limits.link:
        raise _refuse(name, f"is a symbolic link with a target longer than {limits.link} bytes")
    return Entry(kind, parts, info, executable=bool(mode & 0o111))


def _kind(name: str, fmt: int) -> Kind:
    if fmt == stat.S_IFDIR or (name.endswith("/") and fmt == 0):
        return "dir"
    if name.endswith("/"):
        raise _refuse(name, "is named as a folder but is not one")
    if fmt == stat.S_IFLNK:
        return "link"
    if fmt in (0, stat.S_IFREG):  # 0: no Unix mode (an archive made on Windows)
        return "file"
    what = {
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
    }.get(fmt, f"a special file (type {fmt:o})")
    raise _refuse(name, f"is {what}: only files, folders and symbolic links are unpacked")


def plan(infos: list[zipfile.ZipInfo], limits: UnpackLimits) -> list[Entry]:
    """Every member checked against the rules, before anything is written."""
    if len(infos) > limits.entries:
        raise ArtifactError(f"the artifact has {len(infos)} members, more than the limit of {limits.entries}")
    entries = [entry for info in infos if (entry := entry_of(info, limits)) is not None]
    claimed = sum(e.info.file_size for e in entries if e.kind == "file")
    if claimed > limits.total:
        raise ArtifactError(f"the artifact unpacks to {claimed} bytes, more than the limit of {limits.total}")
    links = {e.parts for e in entries if e.kind == "link"}
    named: set[tuple[str, ...]] = set()
    for entry in entries:
        for depth in range(1, len(entry.parts)):
            if entry.parts[:depth] in links:
                raise _refuse(entry.name, f"lies below the symbolic link {'/'.join(entry.parts[:depth])!r}")
        if entry.kind != "dir":
            if entry.parts in named:
                raise _refuse(entry.name, "is in the archive twice")
            named.add(entry.parts)
    return entries


def check_directory(path: Path, limits: UnpackLimits) -> None:
    """Count the members of the zip's central directory, and bound its size, before zipfile
    reads it (it would hold every member's ZipInfo, about 500 bytes each, in memory)."""
    with open(path, "rb") as fp:
        size = fp.seek(0, os.SEEK_END)
        tail_len = min(size, 22 + 0xFFFF)  # the end record, after a comment of up to 64 KiB
        fp.seek(size - tail_len)
        tail = fp.read(tail_len)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            raise ArtifactError("the artifact is not a zip file (no end of central directory)")
        _sig, _disk, _cd_disk, _n_disk, count, cd_size, _cd_offset, _comment = struct.unpack_from("<4s4H2LH", tail, at)
        cd_end = size - tail_len + at
        if count == 0xFFFF or cd_size == 0xFFFFFFFF:  # zip64: the sizes are in the zip64 end record
            record = cd_end - 20 - 56
            if record < 0:
                raise ArtifactError("the artifact is not a zip file (a zip64 end record is missing)")
            fp.seek(record)
            head = fp.read(56)
            if len(head) < 56 or head[:4] != b"PK\x06\x06":
                raise ArtifactError("the artifact is not a zip file (a zip64 end record is missing)")
            count, cd_size = struct.unpack_from("<QQ", head, 32)
            cd_end = record
        if count > limits.entries:
            raise ArtifactError(f"the artifact has {count} members, more than the limit of {limits.entries}")
        if cd_size > limits.directory:
            raise ArtifactError(
                f"the artifact's central directory is {cd_size} bytes, more than the limit of {limits.directory}"
            )
        fp.seek(max(0, cd_end - cd_size))
        directory = fp.read(cd_size)
    found = pos = 0
    while pos + 46 <= len(directory) and directory[pos : pos + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<3H", directory, pos + 28)
        pos += 46 + name_len + extra_len + comment_len
        found += 1
        if found > limits.entries:  # the end record understated it
            raise ArtifactError(f"the artifact has more than {limits.entries} members, the limit")


def unpack(archive: Path, dest: Path, limits: UnpackLimits | None = None) -> None:
    """Unpack `archive` into the folder `dest`, which must not exist: into a temporary
    folder beside it, renamed to `dest` once every member is written and checked."""
    limits = limits or UnpackLimits()
    check_directory(archive, limits)
    tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=dest.parent))  # 0700
    try:
        try:
            with zipfile.ZipFile(archive) as zf:
                _extract(zf, tmp, limits)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, NotImplementedError) as exc:
            raise ArtifactError(f"the artifact is not a valid zip file: {exc}") from exc
        os.rename(tmp, dest)
    except BaseException:
        remove_tree(tmp)
        raise


def _extract(zf: zipfile.ZipFile, root: Path, limits: UnpackLimits) -> None:
    entries = plan(zf.infolist(), limits)
    written = 0
    links: list[Entry] = []
    for entry in entries:
        try:
            if entry.kind == "dir":
                _make_dirs(root, entry.parts)
            elif entry.kind == "file":
                _make_dirs(root, entry.parts[:-1])
                written = _write(zf, entry, root.joinpath(*entry.parts), written, limits)
            else:
                links.append(entry)
        except OSError as exc:
            raise _os_error(entry, exc) from exc
    made = []
    for entry in links:  # last: nothing is ever written through a link
        target = _link_target(zf, entry, limits)
        path = root.joinpath(*entry.parts)
        try:
            _make_dirs(root, entry.parts[:-1])
            os.symlink(target, path)
        except OSError as exc:
            raise _os_error(entry, exc) from exc
        made.append((entry, path))
    inside = os.path.realpath(root)
    for entry, path in made:  # with every link in place: a target through another link is followed
        real = os.path.realpath(path)
        if real != inside and not real.startswith(inside + os.sep):
            raise _refuse(entry.name, "is a symbolic link pointing outside the folder")


def _os_error(entry: Entry, exc: OSError) -> ArtifactError:
    if exc.errno in _LOCAL_ERRNOS:
        return ArtifactError(f"cannot unpack the artifact: {exc.strerror}", reason="StartFailed")
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        return _refuse(entry.name, "conflicts with another member of the same path")
    return _refuse(entry.name, f"cannot be unpacked: {exc.strerror or exc}")


def _make_dirs(root: Path, parts: tuple[str, ...]) -> None:
    path = root
    for part in parts:
        path = path / part
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise
            continue
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask


def _write(zf: zipfile.ZipFile, entry: Entry, path: Path, written: int, limits: UnpackLimits) -> int:
    mode = 0o700 if entry.executable else 0o600
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(fd, mode)
        for block in _read(zf, entry):
            written += len(block)
            if written > limits.total:
                raise ArtifactError(f"the artifact unpacks to more than the limit of {limits.total} bytes")
            out.write(block)
    return written


def _read(zf: zipfile.ZipFile, entry: Entry) -> Iterator[bytes]:
    try:
        with zf.open(entry.info) as member:
            while block := member.read(_BLOCK):
                yield block
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise _refuse(entry.name, f"is corrupt: {exc}") from exc


def _link_target(zf: zipfile.ZipFile, entry: Entry, limits: UnpackLimits) -> str:
    raw = b"".join(_read(zf, entry))
    if len(raw) > limits.link:
        raise _refuse(entry.name, f"is a symbolic link with a target longer than {limits.link} bytes")
    target = os.fsdecode(raw)
    if not target or "\0" in target:
        raise _refuse(entry.name, "is a symbolic link without a valid target")
    if target.startswith("/"):
        raise _refuse(entry.name, f"is a symbolic link to an absolute path ({target!r})")
    resolved = posixpath.normpath(posixpath.join(*entry.parts[:-1], target) if len(entry.parts) > 1 else target)
    if resolved == ".." or resolved.startswith("../"):
        raise _refuse(entry.name, f"is a symbolic link pointing outside the folder ({target!r})")
    return target


def remove_tree(path: Path) -> None:
    """Remove a folder a run or an unpacking left, also where the run took away its own
    write permission on a folder; what cannot be removed is left (and logged by the caller)."""

    def retry(func: object, failed: str, _exc: object) -> None:
        parent = os.path.dirname(failed)
        os.chmod(parent, 0o700)
        if callable(func):
            func(failed)

    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path, onerror=retry)
