"""Wait probes: a command run directly (no shell) with a timeout and an output limit, off
the reconcile workers (`Probes`): a probe may take up to its timeout, and a worker that
waited for it would hold up every other job."""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import threading
from typing import Callable

from ..api.job import WaitCondition

log = logging.getLogger(__name__)

PROBE_THREADS = 8  # probes in flight at once; more wait their turn


def run_probe(cond: WaitCondition, cwd: str | None = None) -> tuple[bool, str]:
    """(exit 0?, a short diagnostic with the output cut to outputLimit bytes)."""
    probe = cond.probe
    try:
        proc = subprocess.Popen(probe.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    except OSError as exc:
        return False, f"probe could not start: {exc.strerror or exc}"
    try:
        out, _ = proc.communicate(timeout=probe.timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.communicate()
        return False, f"probe timed out after {probe.timeout:g}s"
    text = out[: probe.output_limit].decode("utf-8", "replace").strip()
    verdict = "succeeded" if proc.returncode == 0 else f"exited {proc.returncode}"
    return proc.returncode == 0, f"probe {verdict}" + (f": {text}" if text else "")


Key = tuple[str, str]  # (job, the condition's JSON)


class Probes:
    """Runs a job's probes in background threads and wakes the job when one ends.

    `result(job, cond, cwd)` hands out the result of a probe that ended since the last
    call, once; otherwise it starts the probe (unless it is running) and returns None. A
    job therefore sees each probe's verdict exactly once, and a new probe starts only when
    a step asks for one (the step's recheck timer paces them by the probe's interval)."""

    def __init__(self, wake: Callable[[str], None], threads: int = PROBE_THREADS):
        self._wake = wake
        self._lock = threading.Lock()
        self._running: set[Key] = set()
        self._ended: dict[Key, tuple[bool, str]] = {}
        self._dropped: set[Key] = set()  # running for a job that stopped waiting: no result, no wake
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        # daemon threads: a probe still running when the controller stops must not hold up
        # the process's exit (it is killed at its own timeout)
        self._threads = [threading.Thread(target=self._work, name=f"probe-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def result(self, job: str, cond: WaitCondition, cwd: str | None) -> tuple[bool, str] | None:
        key = (job, cond.model_dump_json())
        with self._lock:
            if key in self._ended:
                return self._ended.pop(key)
            if key in self._running:
                return None
            self._running.add(key)
        self._todo.put((key, cond, cwd))
        return None

    def forget(self, job: str) -> None:
        """The job stopped waiting: drop its results, and those of its probes still running."""
        with self._lock:
            for key in [k for k in self._ended if k[0] == job]:
                del self._ended[key]
            for key in [k for k in self._running if k[0] == job]:
                self._running.discard(key)
                self._dropped.add(key)

    def close(self) -> None:
        for _ in self._threads:
            self._todo.put(None)

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            key, cond, cwd = item
            try:
                outcome = run_probe(cond, cwd)
            except Exception as exc:  # a probe that cannot run is a failed probe, not a dead thread
                log.warning("probe for job %s failed to run", key[0], exc_info=True)
                outcome = (False, f"probe could not run: {exc}")
            with self._lock:
                if key in self._dropped:
                    self._dropped.discard(key)
                    continue
                self._running.discard(key)
                self._ended[key] = outcome
            self._wake(key[0])
