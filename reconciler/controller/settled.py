"""Hints from this process's writers to its change watcher: "the job named N, as written at
resourceVersion R (uid U), needs no look from the loop". A Source's lane stores new jobs as
the loop's first look would leave them; a suspended one is then at rest, and looking at it
only reads it (a read a message, on a burst from a queue). The watcher skips the change a
hint names exactly, and looks at every other.

The lane gives its hints inside its transaction, before the commit, so that no poll can see
the jobs before their hints. The uid (a new one for every job made) keeps a hint exact even
if that transaction is rolled back and its resourceVersion goes to a later commit: no other
job has that uid. Every hint at or below the watcher's position is dropped at each poll, so
the ones of a rolled-back batch do not stay. Hints are never needed for correctness, only
for sparing work: a change without one is looked at."""

from __future__ import annotations

import threading

from ..store.feed import Change


class SettledHints:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[str, tuple[int, str]] = {}  # job name -> (resourceVersion, uid) it rests at

    def add(self, settled: list[tuple[str, int, str]]) -> None:
        """Jobs written at rest: (name, resourceVersion, uid) each."""
        with self._lock:
            self._at.update((name, (rv, uid)) for name, rv, uid in settled)

    def take(self, change: Change) -> bool:
        """Whether this change of a job is one a hint names (the hint is used up)."""
        with self._lock:
            if self._at.get(change.name) != (change.resource_version, change.uid):
                return False
            del self._at[change.name]
            return True

    def prune(self, seen: int) -> None:
        """Drop the hints for changes at or below `seen`, which the watcher has passed."""
        with self._lock:
            if self._at:
                self._at = {name: at for name, at in self._at.items() if at[0] > seen}

    def __len__(self) -> int:
        return len(self._at)
