"""Shared pieces of the benchmark suite: scratch stores, the table row, machine facts,
process sampling. Benchmarks print figures; nothing here asserts a time."""

from __future__ import annotations

import atexit
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PG_URL = os.environ.get("RECONCILER_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
PYTHON = sys.executable


def log(message: str) -> None:
    """Progress goes to stderr; stdout carries only the figures."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def byte_compile() -> None:
    """Compile the product's modules to .pyc, as `pip install` of a wheel does, so that the
    whole commands measured (`up`, `apply`, `get`) pay for importing the code and not for
    compiling it: an editable install (this repository's venv) under PYTHONDONTWRITEBYTECODE=1
    never writes them, and every command then compiled ~130 modules from source (about 0.1 s
    of `up`'s fixed cost). What is already compiled is only looked at."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("reconciler")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        compileall.compile_dir(folder, quiet=1)


# --------------------------------------------------------------------------- the table row


@dataclass
class Row:
    figure: str  # e.g. "1 DAG throughput (sqlite)"
    reconciler: str  # what the reconciler measured, human readable
    reference: str  # the side-by-side reference measured in the same run
    result: float | None  # the number compared with the aim (a ratio, ms, s, %, MB)
    unit: str  # unit of `result` ("x" for a ratio)
    aim: float | None  # the aim for `result`, lower is better
    notes: list[str] = field(default_factory=list)  # breakdowns printed under the table

    @property
    def met(self) -> str:
        if self.result is None or self.aim is None:
            return "-"
        return "yes" if self.result <= self.aim else "NO"

    def result_text(self) -> str:
        return "n/a" if self.result is None else fmt(self.result, self.unit)

    def aim_text(self) -> str:
        return "-" if self.aim is None else "<= " + fmt(self.aim, self.unit)


def fmt(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f}%"
    if unit in ("ms", "us"):
        return f"{value:.2f} {unit}"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "MB":
        return f"{value:.0f} MB"
    return f"{value:g} {unit}".strip()


def failed_row(figure: str, error: BaseException) -> Row:
    text = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    return Row(figure, "FAILED", "-", None, "", None, [f"{figure}: {text}"])


def print_table(rows: list[Row], title: str = "reconciler benchmarks", stream=None) -> None:
    stream = stream or sys.stdout
    headers = ("figure", "reconciler", "reference", "result", "aim", "met")
    table = [headers] + [(r.figure, r.reconciler, r.reference, r.result_text(), r.aim_text(), r.met) for r in rows]
    widths = [max(len(str(line[i])) for line in table) for i in range(len(headers))]
    print(f"\n{title}", file=stream)
    for facts in machine_facts():
        print(f"  {facts}", file=stream)
    rule = "-+-".join("-" * w for w in widths)
    for i, line in enumerate(table):
        print(" | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=stream)
        if i == 0:
            print(rule, file=stream)
    notes = [n for r in rows for n in r.notes]
    if notes:
        print("\nnotes:", file=stream)
        for note in notes:
            print(f"  - {note}", file=stream)
    stream.flush()


# --------------------------------------------------------------------------- the machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "reconciler"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "") if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def source_fingerprint() -> str:
    """A digest of the product's source (reconciler/**/*.py): tells whether the code measured
    changed while the suite ran (other people work in this tree)."""
    import hashlib

    digest = hashlib.sha1()
    for path in sorted((ROOT / "reconciler").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        with suppress(OSError):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


START: dict[str, Any] = {"git": None, "source": None, "mkdir": None}


def mark_start() -> None:
    """Record what is measured, before the first figure."""
    START["git"], START["source"], START["mkdir"] = git_revision(), source_fingerprint(), mkdir_cost()


def mkdir_cost(count: int = 100) -> float:
    """Microseconds of this thread's CPU (the kernel's included) a mkdir takes in a new scratch
    folder, median of `count`: about 25 here, up to ~900 within a minute or two of a mass
    deletion (`discard` says why). Printed with the figures, as the load average is: both say how to read them."""
    folder = Path(tempfile.mkdtemp(prefix="reconciler-bench-probe-"))
    spent = []
    try:
        for i in range(count):
            before = time.thread_time()
            os.mkdir(folder / str(i))
            spent.append(time.thread_time() - before)
    finally:
        discard(folder)
    return statistics.median(spent) * 1e6


def machine_facts() -> list[str]:
    import sqlite3

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 1
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    mkdir = f"{mkdir_cost():.0f} us" if START["mkdir"] is None else f"{START['mkdir']:.0f} -> {mkdir_cost():.0f} us"
    git, source = git_revision(), source_fingerprint()
    if START["source"] is None:
        code = f"git {git}; product source {source}"
    elif START["source"] == source and START["git"] == git:
        code = f"git {git}; product source {source} (unchanged during the run)"
    else:
        code = (
            f"git {START['git']} -> {git}; product source {START['source']} -> {source}: CHANGED during the run, "
            "the figures mix versions"
        )
    return [
        f"date {datetime.now(UTC).isoformat(timespec='seconds')}; {code}",
        f"nproc {usable} ({os.cpu_count()} online); CPU {cpu_model()}; load average {load}; mkdir {mkdir}",
        f"python {platform.python_version()} ({platform.python_implementation()}); SQLite {sqlite3.sqlite_version};"
        f" {platform.system()} {platform.release()}",
    ]


# --------------------------------------------------------------------------- stores


def pg_available(url: str = PG_URL) -> bool:
    try:
        import psycopg

        with psycopg.connect(url, autocommit=True, connect_timeout=2):
            return True
    except Exception:
        return False


# ------------------------------------------------------------------- scratch, and its removal

_trash: Path | None = None
_trash_lock = threading.Lock()


def discard(path: Path) -> None:
    """Remove a scratch file or tree, but only when this process exits: until then it is moved
    into a trash folder in the temporary folder (a rename frees no inode). On an ext4 without a journal (this
    machine's root) allocating an inode skips every inode of its group freed in the last 60 s
    (ext4's `recently_deleted`, up to 360 s while their table block is unwritten), a scan that
    made each run's mkdir and file creations cost up to ~0.9 ms of kernel CPU after a round's
    scratch of thousands of files was deleted: the harness's own cleanup, not the commands it
    times, was measured. No user's `up` deletes thousands of files a minute."""
    global _trash
    if not os.path.lexists(path):
        return
    with _trash_lock:
        if _trash is None:
            _trash = Path(tempfile.mkdtemp(prefix="reconciler-bench-trash-"))
            atexit.register(shutil.rmtree, _trash, ignore_errors=True)
        target = _trash / uuid.uuid4().hex
    try:
        os.rename(path, target)
    except OSError:  # another filesystem (a scratch outside the temporary folder): removed now
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with suppress(OSError):
                os.unlink(path)


@contextmanager
def scratch(kind: str, prefix: str = "reconciler-bench-") -> Iterator[tuple[str, Path]]:
    """A fresh, empty store and a scratch folder: (store URL, folder). SQLite lives in the
    folder; PostgreSQL gets a new database, dropped afterwards. The folder also serves as
    XDG_STATE_HOME (run dirs of a PostgreSQL store) for processes the benchmark starts."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if kind == "sqlite":
            yield f"sqlite:///{folder / 'state' / 'state.db'}", folder
            return
        if kind != "pg":
            raise ValueError(kind)
        import psycopg

        name = f"reconciler_bench_{uuid.uuid4().hex[:10]}"
        base = PG_URL.rsplit("/", 1)[0]
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{base}/{name}", folder
        finally:
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        discard(folder)


@contextmanager
def state_home(folder: Path) -> Iterator[None]:
    """Point this process's state dir (run dirs of a PostgreSQL store) into the scratch folder."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(folder / "xdg-state")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = old


def child_env(url: str, folder: Path) -> dict[str, str]:
    """Environment of a reconciler subprocess: its store and a private state dir."""
    return {**os.environ, "RECONCILER_STORE": url, "XDG_STATE_HOME": str(folder / "xdg-state"), "PYTHONUNBUFFERED": "1"}


def sql_scalar(store, query: str, **params):
    from reconciler.store.dbapi import Statement

    with store.read() as session:
        return Statement(query).execute(session, params).scalar()


# --------------------------------------------------------------------------- numbers


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def make_available() -> bool:
    return shutil.which("make") is not None


def run_make(folder: Path, jobs: int, target: str = "all", repeat: int = 3) -> list[float]:
    """Wall times of `make -s -j JOBS TARGET` in `folder` (phony targets: every run does all)."""
    walls = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(["make", "-s", "-C", str(folder), f"-j{jobs}", target], check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
    return walls


# --------------------------------------------------------------------------- processes


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.1, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {timeout:g}s: {what}")
        time.sleep(interval)


def vm_hwm_kb(pid: int) -> int | None:
    """Peak resident set size (VmHWM) of a live process, in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class RssSampler:
    """Samples a process's RSS in a thread; `peak` in bytes (max of samples)."""

    def __init__(self, pid: int, interval: float = 0.05):
        import psutil

        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                self.last = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, self.last)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


class Controller:
    """`python -m reconciler controller` as a subprocess on a store (the real verb)."""

    def __init__(self, url: str, folder: Path, *, name: str = "controller"):
        self.log_path = folder / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115  # open for the process's lifetime; closed by stop()
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "reconciler", "--store", url, "controller"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env(url, folder),
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_started(self, timeout: float = 60.0) -> None:
        """Until the process says it runs (imports done, store open, controller started)."""
        wait_for(
            lambda: self.check() or "controller running on node" in self.tail(100_000),
            timeout,
            0.05,
            "the controller started",
        )

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"controller exited with {self.proc.returncode}: {self.tail()}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def kill_run_groups(store, names: list[str]) -> None:
    """SIGKILL the process groups of the named jobs' open runs (long-running helpers the
    benchmark itself asked for), so nothing outlives the benchmark, and remove their
    cgroups (no controller records those runs' ends)."""
    from reconciler.agent.cgroups import CgroupUnavailable, detect
    from reconciler.agent.identity import ProcessIdentity, is_alive
    from reconciler.reads import job_statuses

    groups = []
    for status in job_statuses(store, names).values():
        for run in status.get("runs", []):
            if run.get("finishedAt") is None and run.get("pid"):
                identity = ProcessIdentity(int(run["pid"]), float(run["processStartTime"]))
                if is_alive(identity):
                    with suppress(ProcessLookupError, PermissionError):
                        os.killpg(identity.pid, signal.SIGKILL)
                if run.get("cgroup"):
                    groups.append(run["cgroup"])
    if not groups:
        return
    try:
        hierarchy = detect()
    except CgroupUnavailable:
        return
    for name in groups:
        group = hierarchy.open(name)
        group.kill_all()
        deadline = time.monotonic() + 10
        while group.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        group.remove()
