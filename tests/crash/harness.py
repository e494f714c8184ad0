"""Real controller processes on a temporary SQLite store, and what tests read back.

Shared by tests/crash and tests/integration_stop (their conftest.py files build an
`Env` per test). Nothing is mocked: controllers are `python -m reconciler controller`
subprocesses (optionally with RECONCILER_FAULT), runs are real process groups under the
sh wrapper, and status is read from the store the CLI reads.

Mutating verbs (apply, cancel, suspend, ...) go through the CLI's real entry point
in-process (tests/data/inprocess.py: ~10 ms instead of ~1 s for a new interpreter);
polling reads one long-lived `Store` so that waiting does not open a store per poll.
`get_json` checks the status through `get job X -o json` itself.

Clean-up does not depend on the product: every controller is started with
RCTEST_ROOT=<the test's tmp dir> in its environment, which every run and
every child of a run inherits, so `Env.close` finds and SIGKILLs exactly the processes
this test caused, whatever state the store or the controller was left in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from reconciler.agent.logs import run_dir
from reconciler.agent.wrapper import WRAPPER_NAME
from reconciler.api.meta import to_epoch
from reconciler.controller.nodes import local_node_name
from reconciler.store import Store
from reconciler.store import repository as repo
from reconciler.store.dbapi import Statement
from tests.data.inprocess import cli
from tests.helpers import Result, remove_run_cgroups, wait_until

API = "reconciler.dev/v1alpha1"
NODE_SLOTS = 4  # the local node's capacity in these tests, whatever the CPU count
TAG = "RCTEST_ROOT"
READY_LINE = "controller running on node"


# -- manifests -------------------------------------------------------------------------
def job(name: str, shell: str, **spec: Any) -> dict:
    return {"apiVersion": API, "kind": "Job", "metadata": {"name": name}, "spec": {"shell": shell, **spec}}


def pool(name: str, slots: int | str, **spec: Any) -> dict:
    return {"apiVersion": API, "kind": "Pool", "metadata": {"name": name}, "spec": {"slots": slots, **spec}}


def node(slots: int = NODE_SLOTS) -> dict:
    return {
        "apiVersion": API,
        "kind": "Node",
        "metadata": {"name": local_node_name()},
        "spec": {"capacity": {"slots": slots}},
    }


# -- processes -------------------------------------------------------------------------
@dataclass(frozen=True)
class Pid:
    """A process recognised by pid and start time (a reused pid is not it)."""

    pid: int
    start: float

    @classmethod
    def of(cls, pid: int) -> Pid:
        return cls(pid, psutil.Process(pid).create_time())

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.start) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`: a run's group is its wrapper's pid."""
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def read_pids(path: Path, count: int, timeout: float = 20.0, *, skip: int = 0) -> list[Pid]:
    """Wait until runs have written `count` pids (one a line) to `path`; identify the ones
    after the first `skip` now, while they are certainly alive (a run only goes on after
    writing them)."""

    def ready():
        try:
            lines = path.read_text().split()
        except FileNotFoundError:
            return None
        return lines if len(lines) >= count else None

    pids = [int(p) for p in wait_until(ready, timeout, message=f"{count} pids in {path}")[skip:count]]
    return [Pid.of(p) for p in pids]


class Controller:
    def __init__(self, env: Env, fault: str | None, name: str, args: tuple[str, ...] = ()):
        environ = {k: v for k, v in os.environ.items() if k != "RECONCILER_FAULT"}
        environ.update(RECONCILER_STORE=env.url, PYTHONUNBUFFERED="1", **{TAG: str(env.root)})
        if fault:
            environ["RECONCILER_FAULT"] = fault
        self.log_path = env.root / f"{name}.log"
        self.fault = fault
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reconciler", "controller", *args],
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=env.work,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float = 30.0) -> Controller:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"controller exited with {self.proc.returncode} before it was ready:\n{self.log()}"
                )
            return READY_LINE in self.log()

        wait_until(ready, timeout, interval=0.02, message="controller ready")
        return self

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            message = f"controller (fault {self.fault}) still running after {timeout}s:\n{self.log()}"
            raise AssertionError(message) from None

    def kill(self) -> None:
        """SIGKILL, as a crash would; reaped at once so no zombie stands in for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


# -- one test's store, controllers and views -----------------------------------------------
class Env:
    def __init__(self, root: Path, *, node_slots: int = NODE_SLOTS):
        self.root = root
        self.url = f"sqlite:///{root / 'state' / 'state.db'}"
        self.work = root / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.controllers: list[Controller] = []
        self._manifests = 0
        self.store = Store(self.url)
        self.apply(node(node_slots))

    # -- verbs, through the CLI ----------------------------------------------------------
    def cli(self, *args: str, ok: bool = True) -> Result:
        result = cli(*args, store=self.url)
        if ok:
            assert result.code == 0, f"reconciler {' '.join(args)} -> {result.code}\n{result.stdout}{result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def apply(self, *docs: dict, force: bool = False, ok: bool = True) -> Result:
        self._manifests += 1
        path = self.work / f"manifest-{self._manifests}.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return self.cli("apply", "-f", str(path), *(["--force"] if force else []), ok=ok)

    def start_controller(
        self, fault: str | None = None, *, ready: bool = True, args: tuple[str, ...] = ()
    ) -> Controller:
        c = Controller(self, fault, f"controller-{len(self.controllers) + 1}" + (f"-{fault}" if fault else ""), args)
        self.controllers.append(c)
        return c.wait_ready() if ready else c

    # -- reading -------------------------------------------------------------------------
    def obj(self, name: str, kind: str = "Job"):
        with self.store.read() as session:
            return repo.get(session, kind=kind, name=name)

    def status(self, name: str) -> dict:
        obj = self.obj(name)
        assert obj is not None, f"job {name} not found"
        return obj.status or {}

    def get_json(self, name: str) -> dict:
        """The job as `reconciler get job NAME -o json` prints it."""
        return json.loads(self.cli("get", "job", name, "-o", "json").stdout)

    def wait_status(self, name: str, predicate, timeout: float = 30.0, message: str = "") -> dict:
        last: dict = {}

        def check():
            nonlocal last
            last = self.status(name)
            return last if predicate(last) else None

        try:
            return wait_until(check, timeout, interval=0.02, message=message or f"{name}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last status of {name}: {json.dumps(last, indent=1)}\n{self.logs()}") from None

    def wait_phase(self, name: str, *phases: str, timeout: float = 30.0) -> dict:
        return self.wait_status(name, lambda s: s.get("phase") in phases, timeout, f"{name} in {phases}")

    def wait_running(self, name: str, run: int = 1, timeout: float = 30.0) -> dict:
        """Running, with run `run` started (pid recorded)."""
        return self.wait_status(
            name,
            lambda s: (
                s.get("phase") == "Running" and any(r["number"] == run and r.get("pid") for r in s.get("runs", []))
            ),
            timeout,
            f"{name} running run {run}",
        )

    def wait_completed(self, names: Iterable[str], timeout: float = 30.0) -> dict[str, dict]:
        return {n: self.wait_phase(n, "Completed", timeout=timeout) for n in names}

    def rows(self, sql: str, **params: Any) -> list:
        """Table rows as named tuples (columns as attributes), read in one read transaction."""
        with self.store.read() as conn:
            return Statement(sql).execute(conn, params).all()

    def admissions(self) -> list:
        return self.rows("SELECT * FROM admissions")

    def queue(self) -> list:
        return self.rows("SELECT * FROM queue ORDER BY rank, eligible_at, job_uid")

    def events(self, name: str) -> list:
        return self.rows("SELECT * FROM events WHERE name = :name ORDER BY id", name=name)

    def run_dir(self, name: str, number: int) -> Path:
        return run_dir(self.root / "state", name, self.obj(name).uid, number)

    def logs(self) -> str:
        return "".join(f"--- {c.log_path.name} ---\n{c.log()[-4000:]}" for c in self.controllers)

    # -- teardown --------------------------------------------------------------------------
    def tagged_processes(self) -> list[psutil.Process]:
        """Every live process started for this test: controllers, run wrappers, their children."""
        me, found = os.getpid(), []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                if proc.environ().get(TAG) == str(self.root) and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def run_processes(self) -> list[psutil.Process]:
        """The tagged processes but the run fork servers of live controllers (a controller's
        own; one that outlives its controller is counted)."""
        controllers = {c.pid for c in self.controllers if c.proc.poll() is None}
        found = []
        for proc in self.tagged_processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                cmd = proc.cmdline()
                if not (len(cmd) > 3 and cmd[3] == f"{WRAPPER_NAME}-server" and proc.ppid() in controllers):
                    found.append(proc)
        return found

    def wrapper_of(self, name: str, number: int) -> Pid | None:
        """The live run wrapper of run `number` of job `name`, found by its argv (the way
        the agent finds it after a crash), whether or not any status records it."""
        target = str(self.run_dir(name, number).resolve())
        for proc in self.tagged_processes():
            try:
                cmd = proc.cmdline()
                if len(cmd) > 4 and cmd[3] == WRAPPER_NAME and cmd[4] == target and os.getpgid(proc.pid) == proc.pid:
                    return Pid(proc.pid, proc.create_time())
            except (psutil.NoSuchProcess, ProcessLookupError):
                continue
        return None

    def close(self) -> None:
        for c in self.controllers:
            c.kill()
        for _ in range(50):
            procs = self.tagged_processes()
            if not procs:
                break
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            psutil.wait_procs(procs, timeout=0.2)
        remove_run_cgroups(self.root)
        self.store.dispose()


# -- run records ---------------------------------------------------------------------------
def intervals(status: dict) -> list[tuple[float, float]]:
    """(started, finished) of every run that has both, in start order."""
    return sorted(
        (to_epoch(r["startedAt"]), to_epoch(r["finishedAt"]))
        for r in status.get("runs", [])
        if r.get("startedAt") and r.get("finishedAt")
    )


def max_overlap(spans: Iterable[tuple[float, float]]) -> int:
    """Most spans open at one instant (a span ending when another starts does not overlap)."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    live = peak = 0
    for _, delta in points:
        live += delta
        peak = max(peak, live)
    return peak


# -- markers: what the runs themselves saw -----------------------------------------------------
def marked(marker_file: Path, body: str) -> str:
    """A shell command that appends `started JOB RUN TIME` before `body` and `ended JOB RUN
        TIME` after it to `marker_file`, then exits with the status of `body` (run in a subshell,
    so an `exit` in it ends only the body)."""
    stamp = f'"$RECONCILER_JOB $RECONCILER_RUN $(date +%s.%N)" >> {marker_file}'
    return f"echo started {stamp}\n( {body} )\nc=$?\necho ended {stamp}; exit $c"


def marker_runs(marker_file: Path) -> dict[str, list[tuple[int, float, float | None]]]:
    """Per job, (run, started, ended) as the runs recorded them, checked on the way: a job's
    runs never overlap and no run number starts twice."""
    lines = (
        [line.split() for line in marker_file.read_text().splitlines() if line.strip()] if marker_file.exists() else []
    )
    by_job: dict[str, list[tuple[float, str, int]]] = {}
    for what, name, run, at in lines:
        by_job.setdefault(name, []).append((float(at), what, int(run)))
    out: dict[str, list[tuple[int, float, float | None]]] = {}
    for name, events in by_job.items():
        runs: list[tuple[int, float, float | None]] = []
        open_run: tuple[int, float] | None = None
        for at, what, run in sorted(events, key=lambda e: (e[0], e[1] == "started")):
            if what == "started":
                assert open_run is None, f"{name}: run {run} started while run {open_run[0]} was still alive: {events}"
                assert run not in [r for r, _, _ in runs], f"{name}: run {run} started twice: {events}"
                open_run = (run, at)
            else:
                assert open_run is not None and open_run[0] == run, (
                    f"{name}: run {run} ended but was not open: {events}"
                )
                runs.append((run, open_run[1], at))
                open_run = None
        if open_run is not None:
            runs.append((open_run[0], open_run[1], None))
        out[name] = runs
    return out


@pytest.fixture
def env(tmp_path):
    """A temporary store and its controllers; everything they started is killed at teardown."""
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()
