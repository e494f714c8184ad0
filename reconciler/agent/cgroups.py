"""A cgroup per run: its memory limit and CPU quota, its usage, and every process it holds.

Two backends, chosen once per agent by `detect`:
- cgroup v2 (one unified hierarchy with the memory and cpu controllers): a run's cgroup is
  `ROOT/reconciler/<run>` with `memory.max` and `cpu.max`;
- cgroup v1 (a hierarchy per controller, as on these machines): `ROOT/memory/reconciler/<run>`
  with `memory.limit_in_bytes`, `ROOT/cpu/reconciler/<run>` with `cpu.cfs_quota_us` over
  `cpu.cfs_period_us`, and `ROOT/cpuacct/reconciler/<run>` for the CPU time (one folder where
  cpu and cpuacct share a mount).

The run's wrapper joins the cgroup itself before the command starts (`join_files`: on v1 it
writes 0, its own and only thread, to each hierarchy's `tasks`; on v2 its pid to
`cgroup.procs`), so everything the command forks is inside, and a process that leaves its
process group (`setsid`, a daemon) is still found and stopped here.
Nothing here blocks: each call is a few reads or writes of cgroupfs files.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..files import read_small

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/sys/fs/cgroup")
PARENT = "reconciler"  # every run's cgroup is a child of this one, in each hierarchy
CFS_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel's floor for cpu.cfs_quota_us / cpu.max
_UNSAFE = frozenset(" \t\n*?[]\\'\"$`")  # the wrapper splits the join files on blanks, unquoted


class CgroupUnavailable(Exception):
    """No cgroup can be made for a run here (no hierarchy, not root, read-only); the message
    says why, for the run's condition."""


class CgroupExists(CgroupUnavailable):
    """A spare cannot become the run's cgroup: the run's is there already (made before a
    crash), and is to be used as it is."""


@dataclass(frozen=True)
class Limits:
    cpu: float | None  # cores; None or 0: no quota
    memory: int | None  # bytes; None or 0: no limit


NO_LIMITS = Limits(None, None)  # what a new cgroup holds


@dataclass(frozen=True)
class Usage:
    peak_memory: int | None  # bytes, the most the cgroup was charged at once (None: not kept here)
    cpu_seconds: float | None
    oom_kills: int  # processes the kernel killed for the cgroup's memory limit


def _write(path: Path, value: str) -> None:
    # cgroupfs answers each write(2) separately: one call, no buffering
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _write_if_there(path: Path, value: str) -> None:
    """A write to a file the kernel offers only in some setups (swap accounting)."""
    if path.exists():
        with contextlib.suppress(OSError):
            _write(path, value)


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    """The value of `key` in a flat keyed file (`memory.events`, `cpu.stat`, `oom_control`)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _int(value)
    return None


class RunCgroup(ABC):
    """One run's cgroup: a folder per hierarchy (one on v2). Every method tolerates a cgroup
    that is already gone."""

    version = ""

    def __init__(self, name: str, dirs: tuple[Path, ...]):
        self.name = name
        self.dirs = dirs
        # the limits it holds, as this process made it (`create`, `rename`); None for one
        # opened as found (a crash may have left it with another run's, or half written)
        self.limits: Limits | None = None

    @property
    def join_files(self) -> list[Path]:
        """What the wrapper joins through, before the command starts: it writes its pid to a
        `cgroup.procs` (the whole process), 0 to a `tasks` (the writing thread itself)."""
        return [d / "cgroup.procs" for d in self.dirs]

    def exists(self) -> bool:
        return any(d.is_dir() for d in self.dirs)

    def pids(self) -> list[int]:
        """Every process in the cgroup (any hierarchy: a process joins them one after another)."""
        found: set[int] = set()
        for d in self.dirs:
            found.update(int(p) for p in (read_small(d / "cgroup.procs") or "").split())
        return sorted(found)

    def signal(self, sig: int, *, spare: int | None = None) -> int:
        """`sig` to every process in the cgroup but `spare` (the wrapper, which must live to
        record the exit). One pass: a process forked meanwhile is caught by the next call.
        Returns how many were signalled."""
        sent = 0
        for pid in self.pids():
            if pid == spare:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                sent += 1
        return sent

    def kill_all(self) -> None:
        """SIGKILL to everything in it, the wrapper too."""
        self.signal(signal.SIGKILL)

    @abstractmethod
    def usage(self) -> Usage: ...

    def remove(self) -> bool:
        """rmdir in each hierarchy; True once none is left. The kernel refuses while a
        process is inside (EBUSY), and so does this."""
        gone = True
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                gone = False
        return gone


class V1Cgroup(RunCgroup):
    version = "v1"

    def __init__(self, name: str, memory: Path, cpu: Path, cpuacct: Path):
        super().__init__(name, tuple(dict.fromkeys((memory, cpu, cpuacct))))
        self.memory, self.cpu, self.cpuacct = memory, cpu, cpuacct

    @property
    def join_files(self) -> list[Path]:
        """`tasks`, written 0 by the single-threaded wrapper: the kernel (5.17 and later) moves
        the writing thread without its lock on every process migration, whose write side waits
        for an RCU grace period when no migration came in the last few milliseconds. A pid
        written to `cgroup.procs` takes that lock: measured here (Linux 6.18), a join of the
        three hierarchies after 50 ms without one 12.3 ms that way, 0.7 ms this one."""
        return [d / "tasks" for d in self.dirs]

    def usage(self) -> Usage:
        usage_ns = _int(read_small(self.cpuacct / "cpuacct.usage"))
        oom_control = read_small(self.memory / "memory.oom_control")
        kills = _keyed(oom_control, "oom_kill")
        if kills is None:  # kernels before 4.13 count no kills: an OOM in progress is all there is
            kills = _keyed(oom_control, "under_oom") or 0
        return Usage(
            peak_memory=_int(read_small(self.memory / "memory.max_usage_in_bytes")),
            cpu_seconds=None if usage_ns is None else usage_ns / 1e9,
            oom_kills=kills,
        )


class V2Cgroup(RunCgroup):
    version = "v2"

    def __init__(self, name: str, path: Path):
        super().__init__(name, (path,))
        self.path = path

    def usage(self) -> Usage:
        usage_us = _keyed(read_small(self.path / "cpu.stat"), "usage_usec")
        return Usage(
            peak_memory=_int(read_small(self.path / "memory.peak")),  # Linux 5.19 and later
            cpu_seconds=None if usage_us is None else usage_us / 1e6,
            oom_kills=_keyed(read_small(self.path / "memory.events"), "oom_kill") or 0,
        )

    def kill_all(self) -> None:
        kill = self.path / "cgroup.kill"  # Linux 5.13 and later: atomic, forks included
        if kill.exists():
            with contextlib.suppress(OSError):
                _write(kill, "1")
                return
        super().kill_all()


def _made(path: Path) -> bool:
    """mkdir; False when it was already there (a run created before a crash, made again)."""
    try:
        path.mkdir()
    except FileExistsError:
        return False
    return True


class Hierarchy(ABC):
    """Where runs' cgroups are made: `create` one with limits, `open` one made before (by
    this process or one that died)."""

    version = ""
    # whether a cgroup can be renamed (v1); cgroup2's filesystem refuses (EPERM), so there a
    # spare made ahead could never become a run's cgroup
    renames = False

    def create(self, name: str, limits: Limits) -> RunCgroup:
        """Run `name`'s cgroup with `limits`. One found made (before a crash: perhaps a spare
        renamed whose limits, another run's, were not rewritten yet, or limits half written)
        is given every one of them, over whatever it holds."""
        _check_name(name)
        self.prepare()
        group = self.open(name)
        new = [d for d in group.dirs if not d.exists()]  # what a failure must not leave behind
        try:
            for d in group.dirs:
                _made(d)
            self._limit(group, limits, NO_LIMITS if len(new) == len(group.dirs) else None)
        except OSError as exc:
            for d in reversed(new):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise CgroupUnavailable(f"cannot create cgroup {group.dirs[0]}: {exc.strerror or exc}") from exc
        group.limits = limits
        return group

    def rename(self, spare: RunCgroup, name: str, limits: Limits) -> RunCgroup:
        """A cgroup made ahead (`Spares`) becomes run `name`'s, with its limits: a rename in
        each hierarchy (kernfs renames in place), undone if one fails. Only the limits the
        spare was not made with are written (a spare is made with the last run's)."""
        _check_name(name)
        group = self.open(name)
        done: list[tuple[Path, Path]] = []
        try:
            for old, new in zip(spare.dirs, group.dirs, strict=True):
                os.rename(old, new)  # never over the run's own: the kernel answers EEXIST
                done.append((old, new))
            self._limit(group, limits, spare.limits)
        except OSError as exc:
            for old, new in reversed(done):
                with contextlib.suppress(OSError):
                    os.rename(new, old)
            if isinstance(exc, FileExistsError):
                raise CgroupExists(f"cgroup {name} exists") from exc
            raise CgroupUnavailable(f"cannot take cgroup {spare.dirs[0]} for {name}: {exc.strerror or exc}") from exc
        group.limits = limits
        return group

    def prepare(self) -> None:
        """Make the parent `reconciler/` in each hierarchy (and what it needs to hold runs)."""
        try:
            for d in self.parents():
                _made(d)
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create {self.parents()[0]}: {exc.strerror or exc}") from exc

    def parents(self) -> list[Path]:
        return [d.parent for d in self.open("x").dirs]

    @abstractmethod
    def open(self, name: str) -> RunCgroup: ...

    @abstractmethod
    def _limit(self, group: RunCgroup, limits: Limits, had: Limits | None) -> None:
        """Write `limits` to a cgroup that holds `had` (NO_LIMITS when new): what differs, a
        limit it holds and `limits` does not as none. `had` None: not known (found made),
        every limit is written."""


class V1Hierarchy(Hierarchy):
    version = "v1"
    renames = True

    def __init__(self, memory: Path, cpu: Path, cpuacct: Path):
        self.memory, self.cpu, self.cpuacct = memory, cpu, cpuacct

    def open(self, name: str) -> V1Cgroup:
        return V1Cgroup(name, self.memory / PARENT / name, self.cpu / PARENT / name, self.cpuacct / PARENT / name)

    def _limit(self, group: RunCgroup, limits: Limits, had: Limits | None) -> None:
        assert isinstance(group, V1Cgroup)
        memory = limits.memory or None
        value = "-1" if memory is None else str(memory)  # -1: no limit
        ram, memsw = group.memory / "memory.limit_in_bytes", group.memory / "memory.memsw.limit_in_bytes"
        # with swap accounting on, the limit holds for swap too, not just RAM; the kernel keeps
        # the RAM limit at or below that one, so a raise writes that one first
        swap = functools.partial(_write_if_there, memsw, value)
        if had is None:  # what it holds is not known: lifted first, an order always allowed
            _write_if_there(memsw, "-1")
            _write(ram, value)
            swap()
        elif memory != (before := had.memory or None):
            if memory is not None and (before is None or memory < before):
                _write(ram, value)
                swap()
            else:
                swap()
                _write(ram, value)
        quota = _quota(limits.cpu)
        held = None if had is None else _quota(had.cpu)
        if had is None or quota != held:
            if quota is not None and held is None:  # a quota new, or over a period not known
                _write(group.cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(group.cpu / "cpu.cfs_quota_us", "-1" if quota is None else str(quota))  # -1: no quota


class V2Hierarchy(Hierarchy):
    version = "v2"

    def __init__(self, root: Path):
        self.root = root

    def open(self, name: str) -> V2Cgroup:
        return V2Cgroup(name, self.root / PARENT / name)

    def prepare(self) -> None:
        try:  # the controllers must be enabled on the way down before a child can use them
            for d in (self.root, self.root / PARENT):
                _made(d)
                _enable(d / "cgroup.subtree_control", ("cpu", "memory"))
        except OSError as exc:
            raise CgroupUnavailable(f"cannot enable cpu and memory under {self.root}: {exc.strerror or exc}") from exc

    def _limit(self, group: RunCgroup, limits: Limits, had: Limits | None) -> None:
        assert isinstance(group, V2Cgroup)
        memory = limits.memory or None
        if had is None or memory != (had.memory or None):
            _write(group.path / "memory.max", "max" if memory is None else str(memory))
            # a limit holds for swap too
            _write_if_there(group.path / "memory.swap.max", "max" if memory is None else "0")
        quota = _quota(limits.cpu)
        if had is None or quota != _quota(had.cpu):
            _write(group.path / "cpu.max", f"{'max' if quota is None else quota} {CFS_PERIOD_US}")


def _quota(cpu: float | None) -> int | None:
    """The CFS quota (us a period) for `cpu` cores; None: no quota."""
    return max(MIN_QUOTA_US, round(cpu * CFS_PERIOD_US)) if cpu else None


def _enable(subtree_control: Path, controllers: tuple[str, ...]) -> None:
    enabled = set((read_small(subtree_control) or "").split())
    missing = [c for c in controllers if c not in enabled]
    if missing:
        _write(subtree_control, " ".join(f"+{c}" for c in missing))


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or _UNSAFE.intersection(name):
        raise CgroupUnavailable(f"{name!r} cannot name a cgroup")


def detect(root: Path = DEFAULT_ROOT) -> Hierarchy:
    """The hierarchy runs' cgroups are made in under `root` (a cgroup filesystem's mount
    point, or a folder of v1 mounts): v2 where the unified hierarchy offers the memory and
    cpu controllers, v1 where memory, cpu and cpuacct are mounted, else CgroupUnavailable.
    Writability is found out by `create`."""
    if _UNSAFE.intersection(str(root)):
        raise CgroupUnavailable(f"{root} cannot hold cgroups the run wrapper joins (a blank or a wildcard)")
    controllers = read_small(root / "cgroup.controllers")
    if controllers is not None:
        offered = set(controllers.split())
        if {"memory", "cpu"} <= offered:
            return V2Hierarchy(root)
        missing = " and ".join(sorted({"memory", "cpu"} - offered))
        raise CgroupUnavailable(f"the cgroup v2 hierarchy at {root} does not offer the {missing} controller")
    found = {
        name: path.resolve()
        for name, probe in (
            ("memory", "memory.limit_in_bytes"),
            ("cpu", "cpu.cfs_quota_us"),
            ("cpuacct", "cpuacct.usage"),
        )
        if (path := root / name / probe).exists()
    }
    if len(found) == 3:
        return V1Hierarchy(found["memory"].parent, found["cpu"].parent, found["cpuacct"].parent)
    raise CgroupUnavailable(f"no cgroup hierarchy with the memory and cpu controllers under {root}")


__all__ = [
    "NO_LIMITS",
    "CgroupExists",
    "CgroupUnavailable",
    "Hierarchy",
    "Limits",
    "RunCgroup",
    "Usage",
    "V1Cgroup",
    "V1Hierarchy",
    "V2Cgroup",
    "V2Hierarchy",
    "detect",
]
