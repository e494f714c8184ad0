"""Reports to the server: a thread sending each run's start and end (a start held back a
moment, so a short run's start and end go together; ends first), several in one request,
with backoff while the server does not answer. A report refused as stale, or as invalid (by
itself: a batch the server refuses so is sent again a report at a time), stops its run and is
not sent again."""

from __future__ import annotations

import logging
import time

from .api import Stale, Unreachable
from .records import Record
from .shared import BACKOFF_FIRST, BACKOFF_MAX, Shared, jitter

log = logging.getLogger("reconciler.agent")

REPORT_BATCH = 200  # reports sent in one request at most


class Reports(Shared):
    def _report(self) -> None:
        delay, wait = BACKOFF_FIRST, None
        if not self._await_acceptance():
            return
        while not self._stop.is_set():
            self._pending.wait(wait)
            self._pending.clear()
            now, wait = time.monotonic(), None
            with self._lock:
                due = []
                for r in self._records.values():
                    if r.stale or not (not r.start_reported or (r.finished and not r.end_reported)):
                        continue
                    quiet = self._quiet_until.get(r.dir)
                    if quiet is not None and not r.finished and now < quiet:
                        wait = quiet - now if wait is None else min(wait, quiet - now)
                        continue  # a start only: it waits a moment for its end
                    due.append(r)
            due.sort(key=lambda r: not r.finished)  # ends first: each frees a slot for the next run
            for i in range(0, len(due), REPORT_BATCH):
                batch = due[i : i + REPORT_BATCH]
                finished = [r.finished for r in batch]  # what each report says, whatever the watcher adds meanwhile
                try:
                    kept = self._send(batch)
                except (Unreachable, Stale) as exc:  # Stale: not this node's agent now (the heartbeat says)
                    log.warning("reports of %d run(s) failed: %s (again in %.1fs)", len(batch), exc, delay)
                    self._stop.wait(jitter(delay))
                    delay = min(delay * 2, BACKOFF_MAX)
                    self._pending.set()
                    break
                delay = BACKOFF_FIRST
                for record, ended, refused in zip(batch, finished, kept, strict=True):
                    self._quiet_until.pop(record.dir, None)
                    if refused is None:
                        record.start_reported = True
                        record.end_reported = ended
                    else:
                        log.warning("run %d of job %s: %s", record.run, record.job, refused)
                        record.stale = True
                        self._begin_stop(record, "Stale")
                    if record.settled:  # a start reported again after a restart costs nothing: not saved for
                        record.save()
                        self._relook.set()

    def _send(self, batch: list[Record]) -> list[str | None]:
        """The reports of `batch` in one request (the server keeps them in one transaction),
        or one request each to a server without the batch route, or when the server refused
        the batch as invalid (422: one report it can never take, such as a record written by
        hand, must not hold back the others for good); per record, None when it was kept,
        else why it was refused, as stale or as invalid."""
        if self._batches:
            try:
                return self.api.reports([{"job": r.job, **r.report()} for r in batch])
            except Unreachable as exc:
                if exc.status not in (404, 405, 422):
                    raise
                if exc.status != 422:
                    self._batches = False  # an older server: a report per request from now on
        kept: list[str | None] = []
        for record in batch:
            try:
                self.api.report(record.job, record.report())
                kept.append(None)
            except Stale as exc:
                kept.append(str(exc))
            except Unreachable as exc:
                if exc.status != 422:
                    raise
                kept.append(f"its report was refused as invalid ({exc})")  # as often as it is sent
        return kept
