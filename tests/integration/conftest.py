"""Fixtures for the integration suite: the real CLI in subprocesses, a real controller
process, real runs, a fresh store per test.

Actions and the outputs under test always go through `python -m reconciler ...`. A new
interpreter costs 0.3-1 s, so *polling* for an intermediate state (a job is Running, a
wait was evaluated) reads the same document `get job X -o json` prints straight from the
store with the project's own `Store` (a real read of the real database, not a stand-in);
final assertions use the CLI's `get jobs -o json`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from reconciler.agent.logs import run_dir
from tests.helpers import Result, remove_run_cgroups, run_cli, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


def epoch(text: str) -> float:
    """RFC 3339 (as written in status) -> seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# the recorded stamps are truncated to milliseconds: a semantic ">= delay" check allows that much
STAMP = 0.0011


def run_intervals(jobs: dict[str, dict], names: list[str] | None = None) -> list[tuple[float, float, str, int]]:
    """(startedAt, finishedAt, job, slots) of every recorded run of the named jobs."""
    out = []
    for name, doc in jobs.items():
        if names is not None and name not in names:
            continue
        for run in doc["status"].get("runs", []):
            assert run.get("startedAt") and run.get("finishedAt"), (name, run)
            out.append((epoch(run["startedAt"]), epoch(run["finishedAt"]), name, doc["spec"].get("slots", 1)))
    return out


def max_concurrent(intervals: list[tuple[float, float, str, int]]) -> int:
    """Most slots in use at any instant; a run ending at the instant another starts does
    not overlap it. A run recorded as ending at the instant it started (the records' times
    have millisecond resolution: it lasted less) holds its slots at that instant."""
    points = []
    for start, end, _, slots in intervals:
        points.append((start, 1, slots))
        # ends sort before starts at the same instant, but a run's own end after its start
        points.append((end, 0 if end > start else 2, -slots))
    used = peak = 0
    for _, _, delta in sorted(points):
        used += delta
        peak = max(peak, used)
    return peak


class Env:
    """One test's world: a store URL, a folder for manifests and files, the CLI."""

    def __init__(self, url: str, root: Path):
        self.url = url
        self.root = root
        self.xdg = root / "xdg-state"  # run logs of a PostgreSQL store land under the user's state dir
        self._store = None
        self.controllers: list[ControllerProcess] = []

    # -- the CLI -------------------------------------------------------------------------
    def cli(self, *args: str, timeout: float = 90, cwd: Path | None = None, input: str | None = None) -> Result:
        return run_cli(
            *args,
            store=self.url,
            timeout=timeout,
            cwd=str(cwd or self.root),
            input=input,
            env={"XDG_STATE_HOME": str(self.xdg)},
        )

    def cli_all(self, *calls: tuple[str, ...]) -> list[Result]:
        """Independent read-only calls, run side by side (each is a new interpreter)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=3) as pool:
            return list(pool.map(lambda args: self.cli(*args), calls))

    def ok(self, *args: str, **kw) -> Result:
        result = self.cli(*args, **kw)
        assert result.code == 0, f"reconciler {' '.join(args)} -> {result.code}\n{result.stdout}\n{result.stderr}"
        return result

    def write(self, relpath: str, text: str) -> Path:
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    def apply(self, relpath: str, text: str | None = None, *extra: str) -> Result:
        path = self.write(relpath, text) if text is not None else self.root / relpath
        return self.ok("apply", "-f", str(path), *extra)

    def up(self, path: Path, timeout: str = "60s") -> Result:
        return self.cli("--store", self.url, "up", "-f", str(path), "--timeout", timeout, timeout=120)

    def jobs(self) -> dict[str, dict]:
        """Every job as `get jobs -o json` prints it, by name."""
        listing = json.loads(self.ok("get", "jobs", "-o", "json").stdout)
        assert listing["kind"] == "List"
        return {item["metadata"]["name"]: item for item in listing["items"]}

    def get_job(self, name: str) -> dict:
        return json.loads(self.ok("get", "job", name, "-o", "json").stdout)

    def wait_jobs(self, *names: str, condition: str = "Completed", timeout: str = "60s") -> Result:
        refs = [f"job/{n}" for n in names] if names else ["--all"]
        return self.cli("wait", *refs, "--for", f"condition={condition}", "--timeout", timeout, timeout=120)

    # -- fast reads for polling ------------------------------------------------------------
    @property
    def store(self):
        if self._store is None:
            from reconciler.store import Store

            self._store = Store(self.url)
        return self._store

    def peek(self, name: str) -> dict | None:
        """The job document (`get job NAME -o json`) read directly from the store."""
        from reconciler.store import repository as repo

        with self.store.read() as session:
            obj = repo.get(session, kind="Job", name=name)
        return obj.manifest() if obj else None

    def status(self, name: str) -> dict:
        doc = self.peek(name)
        return (doc or {}).get("status") or {}

    def wait_status(self, name: str, predicate: Callable[[dict], Any], timeout: float = 30, what: str = "") -> dict:
        def check():
            status = self.status(name)
            return status if predicate(status) else None

        try:
            return wait_until(check, timeout=timeout, interval=0.03, message=f"{name}: {what}")
        except AssertionError:
            raise AssertionError(
                f"{name}: {what} not reached; last status: {json.dumps(self.status(name), indent=1)}"
                + self.controller_log()
            ) from None

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict:
        return self.wait_status(name, lambda s: s.get("phase") == phase, timeout, f"phase {phase}")

    def wait_completed(self, *names: str, timeout: float = 60) -> None:
        """Every named job (default: every job) Completed, polled from the store (the `wait`
        verb itself is under test in test_run_wait.py)."""
        from reconciler.store import repository as repo

        def done():
            with self.store.read() as session:
                objs = repo.list_objects(session, kind="Job", names=list(names) or None)
            return objs and all((o.status or {}).get("phase") == "Completed" for o in objs)

        try:
            wait_until(done, timeout=timeout, interval=0.05, message="jobs completed")
        except AssertionError:
            raise AssertionError(
                "jobs not completed: "
                + json.dumps(
                    {n: d["status"] for n, d in self.jobs().items() if d["status"].get("phase") != "Completed"},
                    indent=1,
                )
                + self.controller_log()
            ) from None

    def run_dir(self, name: str, number: int) -> Path:
        doc = self.peek(name)
        base = self.store.state_dir if self.url.startswith("sqlite") else self.xdg / "reconciler"
        return run_dir(base, name, doc["metadata"]["uid"], number)

    # -- a controller process ----------------------------------------------------------------
    def controller(self) -> ControllerProcess:
        proc = ControllerProcess(self)
        self.controllers.append(proc)
        return proc

    def controller_log(self) -> str:
        return "".join(f"\n--- controller stderr ---\n{c.log_text()}" for c in self.controllers)

    def close(self) -> None:
        for c in self.controllers:
            c.stop()
        kill_stray_runs(self.root)
        remove_run_cgroups(self.root)
        if self._store is not None:
            self._store.dispose()


class ControllerProcess:
    """`python -m reconciler controller` against the test's store, stopped at teardown."""

    def __init__(self, env: Env):
        self.env = env
        self.log_path = env.root / f"controller-{len(env.controllers)}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115  # the process's log for its lifetime; closed by stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "controller"],
            cwd=env.root,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RECONCILER_STORE": env.url, "XDG_STATE_HOME": str(env.xdg)},
        )

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 30) -> None:
        wait_until(lambda: "controller running" in self.log_text() or self.proc.poll() is not None, timeout=timeout)
        assert self.proc.poll() is None, f"the controller exited {self.proc.returncode}:\n{self.log_text()}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def kill_stray_runs(root: Path) -> None:
    """Runs (our wrapper, `reconciler-run`, and its process group) whose run dir lies under
    this test's folder and that outlived their controller: kill them, by pid."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if len(cmd) > 4 and cmd[3] == "reconciler-run" and cmd[4].startswith(str(root)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.info["pid"], signal.SIGKILL)


@pytest.fixture
def env(sqlite_url, tmp_path):
    """A test world on a fresh SQLite store."""
    world = Env(sqlite_url, tmp_path)
    yield world
    world.close()


@pytest.fixture
def any_env(store_url, tmp_path):
    """The same, once on SQLite and once on PostgreSQL."""
    world = Env(store_url, tmp_path)
    yield world
    world.close()


def job_yaml(name: str, spec: str, labels: str = "{}") -> str:
    """One Job document; `spec` is YAML indented by the caller's dedent rules."""
    body = textwrap.indent(textwrap.dedent(spec).strip(), "  ")
    head = f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata:\n  name: {name}\n  labels: {labels}\n"
    return f"{head}spec:\n{body}\n"


def docs(*documents: str) -> str:
    return "---\n".join(documents)


def pool_yaml(name: str, slots: int | str, max_bypass: int | None = None) -> str:
    extra = f"\n  maxBypass: {max_bypass}" if max_bypass is not None else ""
    return (
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata:\n  name: {name}\nspec:\n  slots: {slots}{extra}\n"
    )


def held_until(path: Path, then: str = "") -> str:
    """A job spec line whose run lasts until the test creates `path` (polled by the run)."""
    tail = f"; {then}" if then else ""
    return f"shell: \"while [ ! -e '{path}' ]; do sleep 0.05; done{tail}\""


def node_yaml(name: str, slots: int) -> str:
    """A Node manifest; it stays NotReady until something posts its heartbeat."""
    return (
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Node\nmetadata:\n  name: {name}\n"
        f"spec:\n  capacity: {{slots: {slots}}}\n"
    )
