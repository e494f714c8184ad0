"""Stopping runs: SIGTERM to a run's group, SIGKILL once its grace period is over (a thread
ticking through the stops in progress, which also takes the looks that wait and the
readiness probes due), and every run held stopped when another agent takes the node over."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .records import Record
from .shared import TICK, Shared

log = logging.getLogger("reconciler.agent")

WRAPPER_GRACE = 2.0  # after SIGKILL of the group, how long the wrapper gets to record


class Stops(Shared):
    def _begin_stop(self, record: Record, reason: str | None) -> None:
        identity = record.identity
        if record.stop_at is not None or record.finished or identity is None:
            return
        record.stop_at = time.monotonic()
        if reason in ("RunTimeout", "DeadlineExceeded"):
            self.local.note_stderr(Path(record.dir), "job timed out")
        log.info("stopping run %d of job %s (%s)", record.run, record.job, reason or "asked")
        self.local.terminate(identity, record.cgroup)

    def _stop_runs(self) -> int:
        """This node is served by another agent now (taken over after a partition): the runs
        this one holds would go on unrecorded, so each is stopped as any run is (SIGTERM,
        SIGKILL after its grace period, by the stops thread) before the agent exits."""
        with self._lock:
            self._replaced = True  # checked under this lock before any start: none comes after this list
            live = [r for r in self._records.values() if not r.finished and r.identity is not None]
        for record in live:
            self._begin_stop(record, "Replaced")
        deadline = time.monotonic() + max((r.grace for r in live), default=0.0) + WRAPPER_GRACE + 1.0
        while any(not r.finished for r in live) and time.monotonic() < deadline:
            time.sleep(TICK)
        return len(live)

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            if self._relook.is_set():
                self._relook.clear()
                self._look_again()
            self._look_at_probes()
            with self._lock:
                stopping = [r for r in self._records.values() if r.stop_at is not None and not r.finished]
            now = time.monotonic()
            for record in stopping:
                identity = record.identity
                assert record.stop_at is not None and identity is not None
                if not self.local.alive(identity):
                    self._exited(record.job)
                elif now >= record.stop_at + record.grace:
                    self.local.kill(
                        identity, record.cgroup, wrapper_too=now >= record.stop_at + record.grace + WRAPPER_GRACE
                    )

    def _look_at_probes(self) -> None:
        """Each live service's readiness probe, run here at its interval (Probes); a verdict
        that changed is reported."""
        with self._lock:
            probed = [(r, self._readiness.get(r.job)) for r in self._records.values() if r.job in self._readiness]
        for record, readiness in probed:
            assert readiness is not None
            uid, cond, cwd, env = readiness
            if record.finished or uid != record.uid:
                with self._lock:
                    self._readiness.pop(record.job, None)
                self.probes.forget(record.job)
                continue
            verdict = self.probes.verdict(record.job, uid, cond, cwd, env)
            if verdict is not None and verdict[0] != record.ready:
                record.ready, record.ready_message = verdict[0], verdict[1]
                record.start_reported = False  # reported again, with the verdict
                self._pending.set()
