"""Hints from this process's writers to its change watcher: "the job named N, as committed at
resourceVersion R, needs no look from the loop". A Source's lane stores new jobs as the
loop's first look would leave them; a suspended one is then at rest, and looking at it only
reads it (a read a message, on a burst from a queue). The watcher skips the change a hint
names exactly, and looks at every other.

A hint is given after its commit, so it names a state that exists (a resourceVersion is
never used by two commits). One given too late, after the watcher already passed its
change, costs the look it would have saved and is dropped at the next poll: hints are
never needed for correctness, only for sparing work."""

from __future__ import annotations

import threading


class SettledHints:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[str, int] = {}  # job name -> the resourceVersion it rests at

    def add(self, settled: list[tuple[str, int]]) -> None:
        """Jobs committed at rest: (name, resourceVersion) each."""
        with self._lock:
            self._at.update(settled)

    def take(self, name: str, resource_version: int) -> bool:
        """Whether this change of the job is one a hint names (the hint is used up)."""
        with self._lock:
            if self._at.get(name) != resource_version:
                return False
            del self._at[name]
            return True

    def prune(self, seen: int) -> None:
        """Drop the hints for changes at or below `seen`, which the watcher has passed."""
        with self._lock:
            if self._at:
                self._at = {name: rv for name, rv in self._at.items() if rv > seen}

    def __len__(self) -> int:
        return len(self._at)
