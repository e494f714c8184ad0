"""Wait probes: a command run directly (no shell) with a timeout and an output limit, off
the reconcile worker (`Probes`): a probe may take up to its timeout, and the worker that
waited for it would hold up every other job."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..api.job import WaitCondition
from ..threads import critical
from .probeprocs import ProbeProcs

log = logging.getLogger(__name__)

PROBE_THREADS = 8  # probes in flight at once; more wait their turn
# the next probe is due once this share of its interval has passed since the last one ended:
# the step's recheck timer that asks for it is jittered to 90-110% of the interval
DUE_AFTER = 0.9


def run_probe(
    cond: WaitCondition,
    cwd: str | None = None,
    running: Callable[[subprocess.Popen[bytes] | None], None] = lambda _: None,
) -> tuple[bool, str]:
    """(exit 0?, a short diagnostic with the output cut to outputLimit bytes). `running` is
    told of the probe's process while it runs (then None), so that it can be killed."""
    probe = cond.probe
    assert probe is not None  # only probe conditions come here
    try:
        proc = subprocess.Popen(
            probe.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return False, f"probe could not start: {exc.strerror or exc}"
    running(proc)
    try:
        out, _ = proc.communicate(timeout=probe.timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.communicate()
        return False, f"probe timed out after {probe.timeout:g}s"
    finally:
        running(None)
    text = out[: probe.output_limit].decode("utf-8", "replace").strip()
    verdict = "succeeded" if proc.returncode == 0 else f"exited {proc.returncode}"
    return proc.returncode == 0, f"probe {verdict}" + (f": {text}" if text else "")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended already
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the probe and whatever it started


Key = tuple[str, str, str]  # (job name, job uid, the condition's JSON)
_Todo = tuple[Key, "_Probe", WaitCondition, "str | None"]


@dataclass
class _Probe:
    running: bool = False
    verdict: tuple[bool, str] | None = None  # the last probe's, once one ended
    ended_at: float = 0.0


class Probes:
    """Runs jobs' probes in background threads; the end of each wakes its job.

    `verdict(...)` answers with the condition's last verdict (None before the first probe
    ended), and starts a probe when none runs and the last one ended an `interval` ago
    (less the timer's jitter) or more. The last verdict stands while the next probe runs, as a Kubernetes readiness
    state does: the status does not churn, and a step that asks again (after a conflict,
    or woken by anything else) gets the same answer instead of losing it."""

    def __init__(
        self,
        wake: Callable[[str], None],
        threads: int = PROBE_THREADS,
        clock: Callable[[], float] = time.monotonic,
        procs: ProbeProcs | None = None,
    ):
        self._wake = wake
        self._clock = clock
        self._recorded = procs  # each probe process on disk while it runs: a crash's are killed
        if procs is not None:
            procs.reap_orphans()
        self._lock = threading.Lock()
        self._probes: dict[Key, _Probe] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}  # running probe processes, by thread id
        self._todo: queue.SimpleQueue[_Todo | None] = queue.SimpleQueue()
        self._closed = False
        # daemon threads: close() kills the probes they wait for, so they end promptly
        self._threads = [critical(f"probe-{i}", self._work) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def verdict(self, job: str, uid: str, cond: WaitCondition, cwd: str | None) -> tuple[bool, str] | None:
        key = (job, uid, cond.model_dump_json())
        with self._lock:
            probe = self._probes.setdefault(key, _Probe())
            interval = cond.probe.interval if cond.probe is not None else 0.0
            due = probe.verdict is None or self._clock() - probe.ended_at >= DUE_AFTER * interval
            if not probe.running and due and not self._closed:
                probe.running = True
                self._todo.put((key, probe, cond, cwd))
            return probe.verdict

    def forget(self, job: str) -> None:
        """The job stopped waiting (or is gone): drop its probes' state; a probe of it that
        is still running ends without a verdict or a wake."""
        with self._lock:
            for key in [k for k in self._probes if k[0] == job]:
                del self._probes[key]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            procs = list(self._procs.values())
        for proc in procs:
            _kill(proc)
        for _ in self._threads:
            self._todo.put(None)

    def _running(self, proc: subprocess.Popen[bytes] | None) -> None:
        recorded, ended = self._recorded, None
        with self._lock:
            if proc is None:
                ended = self._procs.pop(threading.get_ident(), None)
            else:
                self._procs[threading.get_ident()] = proc  # first: close() kills what it holds
                if self._closed:
                    _kill(proc)
        if recorded is None:
            return
        subject = proc if proc is not None else ended
        if subject is None:
            return
        try:
            if proc is not None:
                recorded.started(subject.pid)
            else:
                recorded.ended(subject.pid)  # reaped: its pid may be anyone's now, its file goes
        except OSError:  # the probe still runs, bounded by its timeout: only a crash's cleanup is lost
            log.warning("the record of probe %d was not kept", subject.pid, exc_info=True)

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            key, probe, cond, cwd = item
            if self._closed:
                continue
            try:
                verdict = run_probe(cond, cwd, self._running)
            except Exception as exc:  # a probe that cannot run is a failed probe, not a dead thread
                log.warning("probe for job %s failed to run", key[0], exc_info=True)
                verdict = (False, f"probe could not run: {exc}")
            with self._lock:
                probe.running, probe.verdict, probe.ended_at = False, verdict, self._clock()
                current = self._probes.get(key) is probe  # else forgotten meanwhile
            if current and not self._closed:
                self._wake(key[0])
