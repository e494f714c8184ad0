"""Following the runs placed on this node: a thread holding the server's long poll, and the
look at each answer that decides, run by run, what to do (start, withdraw, stop, adopt,
report again), then leaves the doing to starts.py and stops.py. A look is taken again
without waiting for the next answer when a record settles or a start went unanswered, at
the runs it skipped; an answer from before the lease ran out is asked anew first."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from .api import Stale, Unreachable
from .shared import BACKOFF_FIRST, BACKOFF_MAX, Shared, jitter

log = logging.getLogger("reconciler.agent")

LONG_POLL = 30.0  # seconds the server may hold a runs request


class Follow(Shared):
    def _follow(self) -> None:
        known, delay = "", BACKOFF_FIRST
        if not self._await_acceptance():
            return
        while not self._stop.is_set():
            try:
                answer = self.api.runs(known, LONG_POLL)
            except (Unreachable, Stale) as exc:
                log.warning("cannot follow the runs of node %s: %s (again in %.1fs)", self.options.node, exc, delay)
                self._stop.wait(jitter(delay))
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_FIRST
            known = answer.get("digest", "")
            try:
                self.reconcile(answer.get("items", []))
            except Exception:  # one bad item must not end the agent's only way to learn of runs
                log.exception("acting on the runs placed on node %s failed", self.options.node)

    def reconcile(self, items: list[dict[str, Any]]) -> None:
        with self._reconciling:
            self._last_items, self._received = items, time.monotonic()
            self._reconcile(items)

    def _look_again(self) -> None:
        """A record settled, or a start went unanswered: an admission skipped meanwhile is looked at
        now, not at the long poll's next answer (which may be 30 s away). Only the skipped ones:
        the answer held may still list a run this agent ended, whose leaving the server does
        not answer (`QUIET_ENDS_HEADER`), and whose record the sweep may have removed since."""
        with self._reconciling:
            if self._skipped and self._last_items is not None:
                only: set[str] | None = set(self._skipped)
                if self._received < self._fresh_after:  # from before the lease ran out: asked anew
                    try:
                        answer = self.api.runs("", 0)
                    except (Unreachable, Stale):
                        return  # the long poll brings it
                    self._last_items, self._received, only = answer.get("items", []), time.monotonic(), None
                self._reconcile(self._last_items, only)

    def _reconcile(self, items: list[dict[str, Any]], only: set[str] | None = None) -> None:
        """Act on an answer, run by run; with `only`, on those jobs' runs alone (the answer
        still tells which runs are placed)."""
        placed: set[tuple[str, int, int]] = set()
        # the skips looked at now are decided anew; with `only`, the others stay, among them one an
        # artifact-ready start (`_exited`, outside `_reconciling`) added after `only` was taken
        with self._lock:  # in place, under the lock that start adds under
            if only is None:
                self._skipped.clear()
            else:
                self._skipped -= only
        for item in items:
            placed.add((item["uid"], item["run"], item["epoch"]))
            if only is not None and item["job"] not in only:
                continue
            with self._lock:
                record = self._records.get(item["job"])
            if record is not None and (record.uid, record.run, record.epoch) == (
                item["uid"],
                item["run"],
                item["epoch"],
            ):
                self._adopted_spec(record, item)
                if item.get("stop"):
                    self._begin_stop(record, item["stop"].get("reason"))
                continue
            if record is not None and not record.settled and record.identity is not None:
                self._skipped.add(item["job"])
                continue  # an older run of the job still ends here: the next waits for it (never two alive)
            if item.get("stop"):
                if not item.get("started"):
                    self._withdraw(item)  # stopped before it started here: it never will
                continue  # else a stop of a run this node has no record of: nothing runs to stop
            if not item.get("started"):
                if self._received >= self._fresh_after:
                    self._start(item)
                else:  # an answer from before the lease ran out: looked at again, asked anew
                    self._skipped.add(item["job"])
                    self._relook.set()
            elif not item.get("finished"):
                self._forgotten(item)
        with self._lock:
            unplaced = [r for r in self._records.values() if (r.uid, r.run, r.epoch) not in placed]
            for job, item in list(self._preparing.items()):
                if (item["uid"], item["run"], item["epoch"]) not in placed:
                    del self._preparing[job]
                    self.local.discard_work(self.local.run_dir(job, item["uid"], item["run"]))
        for record in unplaced:
            if record.settled:
                with self._lock:
                    self._records.pop(record.job, None)
                    self._by_folder.pop(Path(record.dir).name, None)
            elif not record.finished:
                # alive, and no longer placed here as far as the server says: report it, so
                # the server confirms it (200) or refuses it (409: then it is stopped)
                record.start_reported = False
                self._pending.set()
