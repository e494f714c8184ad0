"""Reading a run's captured output: the last lines, or following it as it grows.

Output is bytes written by arbitrary programs; it is decoded as UTF-8 with
replacement so a stray byte never breaks `reconciler logs`.
"""

from __future__ import annotations

import codecs
import os
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator

_BLOCK = 64 * 1024


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


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def read_log(path: str | os.PathLike[str], *, tail: int | None = None) -> str:
    """The file's text, or only its last `tail` lines (like `tail -n`).

    With `tail`, the file is read backwards in blocks until enough newlines are
    seen, so the cost follows the size of the answer, not of the log.
    Raises FileNotFoundError when there is no such file.
    """
    with open(path, "rb") as f:
        if tail is None:
            return _decode(f.read())
        if tail <= 0:
            return ""
        end = f.seek(0, os.SEEK_END)
        pos, chunks, newlines = end, [], 0
        while pos > 0 and newlines <= tail:
            step = min(_BLOCK, pos)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            chunks.append(chunk)
            newlines += chunk.count(b"\n")
        data = b"".join(reversed(chunks))
    # A final newline ends the last line rather than starting another one.
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(tail):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return _decode(data)  # fewer lines than asked: the whole file
    return _decode(data[cut + 1 :])


class _Reader:
    """Incremental reader of one file: remembers its offset, splits whole lines."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self.offset = 0
        # Incremental: a multi-byte character split across two reads stays whole.
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.partial = ""

    def read_lines(self) -> tuple[str, bool]:
        """New complete lines since the last call, and whether any bytes arrived."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size < self.offset:  # truncated or replaced: start over
                    self.offset = 0
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return "", False  # not created yet
        self.offset += len(data)
        text = self.partial + self.decoder.decode(data)
        cut = text.rfind("\n") + 1
        self.partial = text[cut:]
        return text[:cut], bool(data)

    def flush(self) -> str:
        rest = self.partial + self.decoder.decode(b"", final=True)
        self.partial = ""
        return rest


def follow(
    paths: Iterable[str | os.PathLike[str]],
    *,
    done: Callable[[], bool],
    poll: float = 0.1,
) -> Iterator[str]:
    """Yield text appended to `paths` (from their start) until done() and all is read.

    Text comes in whole lines per file, so lines of stdout and stderr never
    interleave mid-line; an unterminated last line is yielded at the end.
    Missing files count as empty (the run may not have created them yet).
    This polls every `poll` seconds: it serves a CLI follower, not the controller.
    """
    readers = [_Reader(p) for p in paths]
    while True:
        # Ask before reading: if the writer was done before this pass, the pass
        # sees everything it wrote, so stopping afterwards loses nothing.
        finished = done()
        progressed = False
        for reader in readers:
            text, got = reader.read_lines()
            progressed = progressed or got
            if text:
                yield text
        if finished:
            for reader in readers:
                rest = reader.flush()
                if rest:
                    yield rest
            return
        if not progressed:
            time.sleep(poll)
