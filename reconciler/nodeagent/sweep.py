"""Removing the folders of ended runs the store no longer keeps (their job deleted, or a
service's oldest runs, whose records its status dropped), as the controller's own agent
does for its node: a thread that looks every SWEEP_INTERVAL at the folders in `runs/`
whose records say the run ended and was reported, asks the server which of them it still
keeps (`POST nodes/N/runs/kept`), and removes the others. A folder is renamed out of the
way (`.removing.<name>`) before it is removed, so an agent killed mid-removal leaves
nothing a later look could take for a run; the next look finishes the removal."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..agent.runfolders import remove_tree
from .api import Unreachable
from .records import load
from .shared import Shared

log = logging.getLogger("reconciler.agent")

SWEEP_INTERVAL = float(os.environ.get("RECONCILER_SWEEP_INTERVAL", "60"))
ASKED_AT_ONCE = 1000  # runs in one request at most (the route's limit)
REMOVING = ".removing."  # a folder on its way out


class Sweep(Shared):
    def _sweep(self) -> None:
        if not self._await_acceptance():
            return
        said = False
        while not self._stop.wait(SWEEP_INTERVAL):
            if not self.sweep_once() and not said:  # asked again at each look: it may be upgraded
                log.info("the server keeps no account of ended runs' folders (an older version): they are kept")
                said = True

    def sweep_once(self) -> bool:
        """One look: the folders of ended runs the server no longer keeps are removed. False
        when the server has no such route (an older version): folders are then kept."""
        runs = self.options.state_dir / "runs"
        try:
            with os.scandir(runs) as entries:
                names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return True
        for name in names:
            if name.startswith(REMOVING):  # a removal a crash interrupted
                remove_tree(runs / name)
        present = set(names)
        self._ended = {name: run for name, run in self._ended.items() if name in present}
        held = [(name, run) for name in names if (run := self._ended_run(runs / name)) is not None]
        for start in range(0, len(held), ASKED_AT_ONCE):
            chunk = held[start : start + ASKED_AT_ONCE]
            try:
                kept = self.api.kept([run for _, run in chunk])
            except Unreachable as exc:
                if exc.status in (404, 405):
                    return False
                log.warning("which run folders to keep could not be asked: %s (again in %gs)", exc, SWEEP_INTERVAL)
                return True
            for (name, _), keep in zip(chunk, kept, strict=True):
                if not keep:
                    self._remove_folder(runs, name)
        return True

    def _ended_run(self, folder: Path) -> tuple[str, int, str] | None:
        """(job uid, run number, node uid) of a run this folder holds, if its record says it
        ended and its end was reported (or refused as stale), names the node's registration it
        was taken on under (a record of an older agent does not: it is kept), and this agent
        holds no unsettled record of it: only such a folder is asked about. A flat name only
        (`job.uid.number`)."""
        parts = folder.name.split(".")
        if len(parts) != 3 or not parts[2].isdigit():
            return None  # the earlier layout, or not a run's folder: left as it is
        with self._lock:
            live = self._by_folder.get(folder.name)
            if live is not None and not live.settled:
                return None
        known = self._ended.get(folder.name)
        if known is not None:
            return known  # a settled record does not change: read once, not at every look
        record = load(folder)
        if record is None or not record.settled or record.node_uid is None:
            return None  # being started, or its end not yet reported: not the server's to judge yet
        known = self._ended[folder.name] = (record.uid, record.run, record.node_uid)
        return known

    def _remove_folder(self, runs: Path, name: str) -> None:
        gone = runs / f"{REMOVING}{name}"
        with self._lock:  # a start of the same folder takes the lock first: never between look and rename
            live = self._by_folder.get(name)
            if live is not None and not live.settled:
                return  # taken on again since it was asked about (the same run adopted anew)
            try:
                os.rename(runs / name, gone)
            except FileNotFoundError:
                return
            except OSError as exc:
                log.warning("the run folder %s could not be removed: %s", runs / name, exc)
                return
            self._by_folder.pop(name, None)
            if live is not None and self._records.get(live.job) is live:
                del self._records[live.job]
        remove_tree(gone)
