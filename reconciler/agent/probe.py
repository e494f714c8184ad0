"""Wait probes: a command run directly (no shell) with a timeout and an output limit, off
the reconcile worker (`Probes`): a probe may take up to its timeout, and the worker that
waited for it would hold up every other job."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..api.job import WaitCondition
from ..threads import critical
from .probeprocs import ProbeProcs
from .process import inherited_environment

log = logging.getLogger(__name__)

PROBE_THREADS = 8  # probes in flight at once; more wait their turn
# the next probe is due once this share of its interval has passed since the last one ended:
# the step's recheck timer that asks for it is jittered to 90-110% of the interval
DUE_AFTER = 0.9


def run_probe(
    cond: WaitCondition,
    cwd: str | None = None,
    running: Callable[[subprocess.Popen[bytes] | None], None] = lambda _: None,
    env: dict[str, str] | None = None,
) -> tuple[bool, str]:
    """(exit 0?, a short diagnostic with the output cut to outputLimit bytes). `running` is
    told of the probe's process while it runs (then None), so that it can be killed. The
    probe's environment is a run's: the agent's without reconciler's own variables (the
    store's URL, tokens), with `env` (the job's spec.env) over it."""
    probe = cond.probe
    assert probe is not None  # only probe conditions come here
    try:
        proc = subprocess.Popen(
            probe.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**inherited_environment(), **(env or {})},
            start_new_session=True,
        )
    except OSError as exc:
        return False, f"probe could not start: {exc.strerror or exc}"
    running(proc)
    try:
        out, in_time = _collect(proc, probe.output_limit, probe.timeout)
    finally:
        running(None)
    if not in_time:
        return False, f"probe timed out after {probe.timeout:g}s"
    text = out.decode("utf-8", "replace").strip()
    verdict = "succeeded" if proc.returncode == 0 else f"exited {proc.returncode}"
    return proc.returncode == 0, f"probe {verdict}" + (f": {text}" if text else "")


def _collect(proc: subprocess.Popen[bytes], limit: int, timeout: float) -> tuple[bytes, bool]:
    """The first `limit` bytes of the probe's output, and whether it exited within `timeout`.
    Read until the probe exits, not until its pipe closes (a child it started in another
    session may hold the pipe for ever); what passes the limit is read and dropped, so a
    chatty probe neither fills memory nor blocks on a full pipe. Once it has exited, what is
    left of its process group is killed (the zombie still holds the group's id), then it is
    reaped; on time out, the group is killed."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    kept = bytearray()
    deadline = time.monotonic() + timeout
    pidfd = -1
    exited = False
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable once the probe exits, without reaping it
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            selector.register(pidfd, selectors.EVENT_READ)
            while not exited and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    if key.fd == pidfd:
                        exited = True
                    elif not _read(fd, kept, limit):  # the pipe closed: only the exit is awaited
                        selector.unregister(fd)
        if exited:
            _kill(proc)  # what is left of its group
            _read(fd, kept, limit, at_most=AFTER_EXIT)  # what it wrote last, still in the pipe
    finally:
        _kill(proc)  # timed out, or this failed (no pidfd: out of descriptors): never left running
        if pidfd >= 0:
            os.close(pidfd)
        proc.stdout.close()
        proc.wait()
    return bytes(kept), exited


AFTER_EXIT = 2**20  # bytes read from the pipe once the probe exited: a child left writing is not waited for


def _read(fd: int, kept: bytearray, limit: int, at_most: int = 4 * 65536) -> bool:
    """Read what the pipe holds now (at most `at_most` bytes: a writer as fast as the reader
    must not keep it from the deadline), keeping up to `limit` bytes in all; False at its end."""
    read = 0
    while read < at_most:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        read += len(chunk)
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return True


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended already
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the probe and whatever it started


Key = tuple[str, str, str]  # (job name, job uid, the condition's JSON)
_Todo = tuple[Key, "_Probe", WaitCondition, "str | None", "dict[str, str] | None"]


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

    def verdict(
        self, job: str, uid: str, cond: WaitCondition, cwd: str | None, env: dict[str, str] | None = None
    ) -> tuple[bool, str] | None:
        key = (job, uid, cond.model_dump_json())
        with self._lock:
            probe = self._probes.setdefault(key, _Probe())
            interval = cond.probe.interval if cond.probe is not None else 0.0
            due = probe.verdict is None or self._clock() - probe.ended_at >= DUE_AFTER * interval
            if not probe.running and due and not self._closed:
                probe.running = True
                self._todo.put((key, probe, cond, cwd, env))
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
            key, probe, cond, cwd, env = item
            if self._closed:
                continue
            try:
                verdict = run_probe(cond, cwd, self._running, env)
            except Exception as exc:  # a probe that cannot run is a failed probe, not a dead thread
                log.warning("probe for job %s failed to run", key[0], exc_info=True)
                verdict = (False, f"probe could not run: {exc}")
            with self._lock:
                probe.running, probe.verdict, probe.ended_at = False, verdict, self._clock()
                current = self._probes.get(key) is probe  # else forgotten meanwhile
            if current and not self._closed:
                self._wake(key[0])
