"""Reading a run's captured output: all of it, its last lines, or following it as it grows,
in blocks, so that memory never grows with a log's size.

Output is bytes written by arbitrary programs; it is decoded as UTF-8 with
replacement so a stray byte never breaks `reconciler logs`.

What is read is what the agent kept (see logtrim.py): a log whose head was dropped to keep
it within the job's logLimit is a sparse file whose head is a hole, or, on a filesystem
that refuses holes, a rotated older part (`stdout.1`) before the live file. Readers skip
the hole (never printing its NUL bytes) and start at the first line boundary after the
cut, so no half line shows.
"""

from __future__ import annotations

import codecs
import errno
import os
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

WORK = "work"  # a run's unpacked artifact, inside its run dir (artifacts.py)

_BLOCK = 64 * 1024  # one read: what a reader holds of a log at a time
_LONG_LINE = 1024 * 1024  # a follower yields a line this long before its end arrives
ROTATED_SUFFIX = ".1"  # the older part of a log whose filesystem refused holes


def run_dir(state_dir: str | os.PathLike[str], job: str, uid: str, number: int, *, legacy: bool = True) -> pathlib.Path:
    """Where run `number` of a job keeps its stdout, stderr and exit record:
    `runs/<job>.<uid>.<number>`. Job names are DNS-1123 labels (no dots) and uids are ours:
    both are safe as path parts, and the name splits back unambiguously.

    One directory per run, not a tree: a run's new inodes (directory, two logs, the exit
    record) are on the path from one job's end to the next one's start, and on a busy disk
    each costs up to a millisecond. Runs started under the earlier layout
    (`runs/<job>/<uid>/<number>`) are still found there, unless `legacy` is False (the
    caller knows there are none: see `has_legacy_runs`)."""
    runs = pathlib.Path(state_dir) / "runs"
    flat = runs / f"{job}.{uid}.{number}"
    if legacy and not flat.exists():
        earlier = runs / job / uid / str(number)
        if earlier.exists():
            return earlier
    return flat


def has_legacy_runs(state_dir: str | os.PathLike[str]) -> bool:
    """Whether any run dir of the earlier layout exists (a directory name without a dot).
    Nothing creates them any more, so one look at start-up holds for the process."""
    try:
        with os.scandir(pathlib.Path(state_dir) / "runs") as entries:
            return any("." not in e.name and e.is_dir(follow_symlinks=False) for e in entries)
    except FileNotFoundError:
        return False


def rotated(path: str | os.PathLike[str]) -> pathlib.Path:
    """Where the older part of a log lives once its filesystem refused holes (logtrim.py)."""
    return pathlib.Path(f"{os.fspath(path)}{ROTATED_SUFFIX}")


def data_start(fd: int, offset: int, size: int) -> int:
    """The first byte at or after `offset` that is not in a hole: `offset` itself where the
    filesystem cannot tell (no SEEK_DATA), and `size` where the rest is all hole."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:
        return max(size, offset) if exc.errno == errno.ENXIO else offset


def _decoder() -> codecs.IncrementalDecoder:
    # incremental: a multi-byte character split across two blocks stays whole
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


class _Part(NamedTuple):
    fd: int
    start: int  # its first kept byte (past a punched hole)
    end: int  # its size when opened


class _KeptLog:
    """The kept bytes of one stream as one run of positions: the rotated older part (if
    any), then the live file past its hole. Sizes are those at opening: what the run writes
    afterwards is for the next look."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC)]  # FileNotFoundError: no such log
        parts = []
        self.rotation: tuple[int, int] | None = None  # which rotation the older part is from
        try:
            older = os.open(rotated(path), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        except BaseException:
            self.close()
            raise
        else:
            self._fds.append(older)
            info = os.fstat(older)
            self.rotation = (info.st_ino, info.st_ctime_ns)
            parts.append(_Part(older, 0, info.st_size))
        fd = self._fds[0]
        start = data_start(fd, 0, os.fstat(fd).st_size)
        size = os.fstat(fd).st_size  # taken after the hole: the agent may have punched past an earlier size
        self.live = _Part(fd, min(start, size), size)
        self.live_base = sum(p.end - p.start for p in parts)  # the position of the live file's first kept byte
        self._parts = [*parts, self.live]
        self.size = self.live_base + size - self.live.start
        self.cut = self.rotation is not None or self.live.start > 0  # the head was dropped: mid-line

    def read(self, pos: int, n: int) -> bytes:
        """Up to `n` bytes from `pos` on, within one part."""
        base = 0
        for part in self._parts:
            length = part.end - part.start
            if pos < base + length:
                offset = part.start + pos - base
                return os.pread(part.fd, min(n, part.end - offset), offset)
            base += length
        return b""

    def read_before(self, end: int, n: int) -> bytes:
        """Up to `n` bytes ending at `end`, within one part."""
        base = 0
        for part in self._parts:
            length = part.end - part.start
            if end <= base + length:
                start = max(base, end - n)
                return os.pread(part.fd, end - start, part.start + start - base)
            base += length
        return b""

    def hole_end(self) -> int:
        """The position below which the live file is a hole now: the agent may punch its head
        further while it is being read."""
        live = self.live
        return self.position(data_start(live.fd, live.start, live.end))

    def catch_up(self) -> None:
        """Read on to the live file's size now: the agent cut past this reader, so all it had
        taken for the log may be gone."""
        size = os.fstat(self.live.fd).st_size
        if size > self.live.end:
            self.live = self.live._replace(end=size)
            self._parts[-1] = self.live
            self.size = self.position(size)

    def position(self, live_offset: int) -> int:
        return self.live_base + live_offset - self.live.start

    def live_offset(self, pos: int) -> int:
        return max(0, self.live.start + pos - self.live_base)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> _KeptLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _next_line(log: _KeptLog, pos: int) -> int:
    """The position just past the first newline at or after `pos`: where whole lines begin
    after a cut. `pos` itself when no newline follows, so a log that is one unbroken line is
    shown from the cut rather than not at all."""
    at = pos
    while block := log.read(at, _BLOCK):
        newline = block.find(b"\n")
        if newline >= 0:
            return at + newline + 1
        at += len(block)
    return pos


def _tail_start(log: _KeptLog, lines: int, floor: int) -> int:
    """Where the last `lines` lines begin, looking back no further than `floor`: the log is
    read backwards in blocks until enough newlines are seen, so the cost follows the size of
    the answer, not of the log. A final newline ends the last line rather than starting
    another one."""
    if lines <= 0:
        return log.size
    pos = log.size
    if pos > floor and log.read(pos - 1, 1) == b"\n":
        pos -= 1
    seen = 0
    while pos > floor and (block := log.read_before(pos, min(_BLOCK, pos - floor))):
        cut = len(block)
        while (cut := block.rfind(b"\n", 0, cut)) >= 0:
            seen += 1
            if seen == lines:
                return pos - len(block) + cut + 1
        pos -= len(block)
    return floor


def _blocks(log: _KeptLog, pos: int) -> Iterator[tuple[int, bytes]]:
    """(position, bytes) of the kept bytes from `pos` to the end, a block at a time. A block
    that starts further on than the previous one ended follows a cut: the agent punched the
    head past the position reached while it was being read, and the rest of that line is
    gone."""
    while pos < log.size:
        data = log.read(pos, _BLOCK)
        if not data:
            return  # truncated under the reader (a rotation)
        if pos >= log.live_base and (hole := log.hole_end()) > pos:
            # punched before this read, which may hold the hole's NUL bytes: go on past it
            log.catch_up()
            pos = _next_line(log, hole)
            continue
        yield pos, data
        pos += len(data)


def read_log(path: str | os.PathLike[str], *, tail: int | None = None) -> Iterator[str]:
    """The kept text of a log, or only its last `tail` lines (like `tail -n`), in pieces of
    whole lines. Raises FileNotFoundError (at the call) when there is no such file."""
    return _read(_KeptLog(path), _Lines(path, tail))


def read_logs(paths: Iterable[str | os.PathLike[str]], *, tail: int | None = None) -> Iterator[str]:
    """The kept text of each of the files that exist (or its last `tail` lines), one after
    the other; each file's text ends with a newline, so two never run together on a line
    (as `reconciler logs` prints them, locally or through an agent's log server)."""
    for path in paths:
        try:
            pieces = read_log(path, tail=tail)
        except FileNotFoundError:  # this stream has no file (or it went since it was listed)
            continue
        last = ""
        for last in pieces:
            yield last
        if last and not last.endswith("\n"):
            yield "\n"


def _read(log: _KeptLog, lines: _Lines) -> Iterator[str]:
    with log:
        yield from lines.look(log)
    if rest := lines.flush():
        yield rest


class _Lines:
    """Reads one log a look at a time, yielding whole lines: remembers where it is in the
    live file, so the next look (a follower's) goes on from there."""

    def __init__(self, path: str | os.PathLike[str], tail: int | None) -> None:
        self.path = path
        self.tail = tail
        self.offset: int | None = None  # in the live file; None before the first look
        self.rotation: tuple[int, int] | None = None
        self.decoder = _decoder()
        self.partial = ""
        self.progressed = False  # whether the last look found new bytes

    def read_lines(self) -> Iterator[str]:
        """The complete lines written since the last look, a block at a time."""
        self.progressed = False
        try:
            log = _KeptLog(self.path)
        except FileNotFoundError:
            return  # not created yet
        with log:
            yield from self.look(log)

    def look(self, log: _KeptLog) -> Iterator[str]:
        pos = self._resume(log)
        for at, data in _blocks(log, pos):
            if at != pos:
                self._drop()
            pos = at + len(data)
            self.progressed = True
            yield from self._lines(data)
        self.offset = log.live_offset(pos)

    def _resume(self, log: _KeptLog) -> int:
        """Where this look starts reading."""
        if self.offset is None:  # the first look: the kept log, or its last `tail` lines
            self.rotation = log.rotation
            start = _next_line(log, 0) if log.cut else 0
            return start if self.tail is None else _tail_start(log, self.tail, start)
        if log.rotation != self.rotation or self.offset > log.live.end:
            # rotated, or truncated by hand: the live file starts over
            self.rotation = log.rotation
            self._drop()
            return log.live_base
        if self.offset < log.live.start:  # the head was punched past what was read: lines lost
            self._drop()
            return _next_line(log, log.live_base)
        return log.position(self.offset)

    def _lines(self, data: bytes) -> Iterator[str]:
        text = self.partial + self.decoder.decode(data)
        cut = text.rfind("\n") + 1
        if not cut and len(text) >= _LONG_LINE:
            cut = len(text)  # a line this long goes out in pieces, so memory stays bounded
        self.partial = text[cut:]
        if cut:
            yield text[:cut]

    def _drop(self) -> None:
        """Forget a line whose rest is gone (a cut overtook the reader): no half line shows."""
        self.partial = ""
        self.decoder.reset()

    def flush(self) -> str:
        rest = self.partial + self.decoder.decode(b"", final=True)
        self.partial = ""
        return rest


def follow(
    paths: Iterable[str | os.PathLike[str]],
    *,
    done: Callable[[], bool],
    tail: int | None = None,
    poll: float = 0.1,
) -> Iterator[str]:
    """Yield the kept text of `paths` (or their last `tail` lines), then what is appended,
    until done() and all is read.

    Text comes in whole lines per file, so lines of stdout and stderr never
    interleave mid-line (but for lines over a MiB); an unterminated last line is yielded
    at the end. Missing files count as empty (the run may not have created them yet).
    This polls every `poll` seconds: it serves a CLI follower, not the controller.
    """
    readers = [_Lines(p, tail) for p in paths]
    while True:
        # Ask before reading: if the writer was done before this pass, the pass sees
        # everything it wrote, so stopping afterwards loses nothing.
        finished = done()
        progressed = False
        for reader in readers:
            yield from reader.read_lines()
            progressed = progressed or reader.progressed
        if finished:
            for reader in readers:
                if rest := reader.flush():
                    yield rest
            return
        if not progressed:
            time.sleep(poll)
