"""Folders that only their owner may read: the store's, and the run logs' (README: state and
logs are owner-only); and small files read without pathlib's and io's layers."""

from __future__ import annotations

import os
from pathlib import Path


def read_small(path: str | os.PathLike[str]) -> str | None:
    """The text of a small file (an exit record, a cgroup's counters), or None when it is
    not there (or, a cgroup file, its cgroup went meanwhile). os calls: a run's end reads a
    few of these, and Path.read_text's layers cost more than the reads."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except ProcessLookupError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def make_private_dirs(path: Path) -> None:
    """Create `path` and whatever of its parents is missing, each 0700 whatever the umask
    (mkdir's mode is masked by it); folders that exist are left as they are."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process: theirs is private too
            continue
        os.chmod(folder, 0o700)
