"""The cgroups of this node's runs, as the agent's facade (local.py) keeps them: the hierarchy
found at start (or why there is none: runs then get the rlimit fallback), the spares made
ahead where a start may rename one, and each run's cgroup opened once by name."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .cgroups import CgroupUnavailable, Hierarchy, Limits, RunCgroup, Usage, detect
from .cgroupspares import Spares
from .cgroupspares import sweep as sweep_spares

log = logging.getLogger(__name__)


class RunCgroups:
    def __init__(self, root: Path):
        self._hierarchy: Hierarchy | None = None
        self._spares: Spares | None = None
        self._open: dict[str, RunCgroup] = {}  # by name: a run's steps ask for its cgroup again and again
        self.unavailable = ""  # why runs get no cgroup here, while none can be made
        try:
            self._hierarchy = detect(root)
            if self._hierarchy.renames:  # else each run's cgroup is made at its start
                self._spares = Spares(self._hierarchy)
            else:  # an earlier version made spares on v2 too: a crash left them
                sweep_spares(self._hierarchy)
        except CgroupUnavailable as exc:
            self.unavailable = str(exc)
            log.warning("runs get no cgroup on this node: %s; memory limits become address-space rlimits", exc)

    @property
    def version(self) -> str | None:
        """The hierarchy runs are limited by here ("v1", "v2"), or None: the fallback."""
        return self._hierarchy.version if self._hierarchy is not None else None

    def make(self, name: str, limits: Limits) -> tuple[RunCgroup | None, str | None]:
        """The run's cgroup, or None and why there is none (never a reason to fail the run)."""
        if self._hierarchy is None:
            return None, self.unavailable
        try:
            group = self._hierarchy.create(name, limits) if self._spares is None else self._spares.take(name, limits)
        except CgroupUnavailable as exc:
            if str(exc) != self.unavailable:  # said once per cause, not once per run
                self.unavailable = str(exc)
                log.warning("runs get no cgroup (%s): memory limits become address-space rlimits", exc)
            return None, str(exc)
        self._open[group.name] = group
        return group, None

    def get(self, name: str | None) -> RunCgroup | None:
        """The run's cgroup by name (None: the run has none, or there is no hierarchy here)."""
        if name is None or self._hierarchy is None:
            return None
        group = self._open.get(name)
        if group is None:
            group = self._open[name] = self._hierarchy.open(name)
            bound(self._open)
        return group

    def exists(self, name: str) -> bool:
        group = self.get(name)
        return group is not None and group.exists()

    def usage(self, name: str | None) -> Usage | None:
        """What the run's cgroup counted: peak memory, CPU seconds, OOM kills."""
        group = self.get(name)
        return group.usage() if group is not None and group.exists() else None

    def remove(self, name: str | None) -> bool:
        """The run is over and its cgroup empty: removed (False while a process is left)."""
        group = self.get(name)
        if group is None:
            return True
        if group.remove():
            self._open.pop(group.name, None)
            return True
        return False

    def close(self) -> None:
        if self._spares is not None:
            self._spares.close()


def bound(cache: dict[Any, Any], size: int = 4096) -> None:
    """A cache of paths stays small: emptied when it outgrows `size` (far more runs than a
    node holds at once)."""
    if len(cache) > size:
        cache.clear()
