"""Folders that only their owner may read: the store's, and the run logs' (README: state and
logs are owner-only)."""

from __future__ import annotations

import os
from pathlib import Path


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
