"""The node agent as the controller hosts it: starts runs on this machine, finds them again
after a restart, stops their process groups, and reports exits through one watcher. This is
the agent's facade: the controller uses what is defined or re-exported here, nothing else."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from ..api.job import Artifact, JobSpec
from ..files import make_private_dirs
from .cgroups import DEFAULT_ROOT, Limits, Usage
from .cwrapper import Binary
from .forkserver import TITLE_MARGIN, ForkServer, ForkServerUnsure, wait_for_servers
from .identity import ProcessIdentity, is_alive, wall_clock_start
from .logs import WORK, has_legacy_runs, run_dir
from .logtrim import LogTrimmer
from .ports import port_free
from .process import (
    ExitRecord,
    StartFailed,
    group_alive,
    group_pids,
    kill_group_except_wrapper,
    read_exit,
    signal_group,
    spawn_run,
)
from .runcgroups import RunCgroups, bound
from .runfolders import FolderRemover
from .watcher import ExitWatcher
from .wrapper import WRAPPER_NAME

if TYPE_CHECKING:
    from .artifacts import Artifacts, Preparation

log = logging.getLogger(__name__)

__all__ = [
    "ExitRecord",
    "LocalAgent",
    "ProcessIdentity",
    "StartFailed",
    "Started",
    "Usage",
    "owner_gone",
    "process_owner",
]

# Where the agent makes runs' cgroups: a cgroup filesystem (v2) or a folder of v1 mounts.
# Pointing it elsewhere (a folder with no hierarchy, one that cannot be written) gives the
# fallback: an address-space rlimit, and runs whose condition says limits are degraded.
CGROUP_ROOT_ENV = "RECONCILER_CGROUP_ROOT"
FORK_SERVER_ENV = "RECONCILER_FORK_SERVER"  # "0": every run exec's its own wrapper (the fork server off)
FORK_SERVERS = "forkservers"  # under the state folder: each fork server's lock file


@dataclass(frozen=True)
class Started:
    """A spawned run: its wrapper, and how its resources are limited."""

    identity: ProcessIdentity
    cgroup: str | None  # the run's cgroup (by name), when it has one
    limits: str  # "cgroup v1" | "cgroup v2" | "rlimit" (the fallback)
    degraded: str | None = None  # why no cgroup holds the run, in a sentence


def process_owner() -> str:
    """host:pid:start of this process: an owner (of a spawn, of a node) that can be proven
    gone on this host."""
    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{me.create_time()}"


def owner_gone(owner: str) -> bool:
    """True when the owner named by `process_owner` has exited; False while it lives or when
    it is on another host (which this one cannot prove)."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname():
        return False
    try:
        return not is_alive(ProcessIdentity(int(pid), float(start)))
    except ValueError:
        return False


class LocalAgent:
    """`on_exit(job)` is called when something the job waits for in the agent happened: its
    run's process exited, or its run's artifact is ready (or cannot be)."""

    def __init__(self, node: str, state_dir: Path, on_exit: Callable[[str], None], *, cgroup_root: Path | None = None):
        self.node = node
        # resolved once: a run's wrapper is given its run dir under it, and `find` knows the
        # wrapper again by that path (resolving each run dir cost 58 us a spawn, lstat by lstat)
        self.state_dir = Path(state_dir).resolve()
        make_private_dirs(self.state_dir / "runs")
        self._legacy_runs = has_legacy_runs(self.state_dir)  # else run_dir needs no look at the disk
        # Paths a run's steps ask for again and again, made once (pathlib's joins were a tenth
        # of the reconcile loop's time): run dirs by (job, uid, number); cgroups in runcgroups.py.
        self._run_dirs: dict[tuple[str, str, int], Path] = {}
        self._on_exit = on_exit
        self._watcher = ExitWatcher()
        self._watched: set[ProcessIdentity] = set()
        self._logs = LogTrimmer()
        self._folders = FolderRemover()
        self._artifacts: Artifacts | None = None  # made by the first run with an artifact
        self._artifacts_lock = threading.Lock()
        self.wrapper = Binary(self.state_dir)  # the C wrapper, built in a thread; the sh one meanwhile
        self._server: ForkServer | None = None  # made with the first run the C wrapper starts
        self._server_lock = threading.Lock()  # several workers may start runs at once
        self._cgroups = RunCgroups(cgroup_root or Path(os.environ.get(CGROUP_ROOT_ENV) or DEFAULT_ROOT))

    @property
    def cgroup_version(self) -> str | None:
        """The cgroup hierarchy runs are limited by here ("v1", "v2"), or None: the fallback."""
        return self._cgroups.version

    @staticmethod
    def cgroup_name(job: str, uid: str, number: int) -> str:
        """A run's cgroup, named like its run dir: unique on the machine (the uid), and
        found again after a restart without a record."""
        return f"{job}.{uid}.{number}"

    def run_dir(self, job: str, uid: str, number: int) -> Path:
        if self._legacy_runs:  # a run may be in the earlier layout: looked for on the disk
            return run_dir(self.state_dir, job, uid, number)
        key = (job, uid, number)
        found = self._run_dirs.get(key)
        if found is None:
            found = self._run_dirs[key] = run_dir(self.state_dir, job, uid, number, legacy=False)
            bound(self._run_dirs)
        return found

    def start(self, job: str, uid: str, number: int, spec: JobSpec, revision: int) -> Started:
        """Spawn run `number` in its own cgroup with the spec's limits (or, where none can be
        made, under an address-space rlimit); raises StartFailed, whatever the cause, when it
        cannot start: a run that cannot start must end (and free its slot), not be retried
        forever."""
        env = {
            **spec.env,
            "RECONCILER_JOB": job,
            "RECONCILER_JOB_UID": uid,
            "RECONCILER_RUN": str(number),
            "RECONCILER_REVISION": str(revision),
        }
        run_dir = self.run_dir(job, uid, number)
        limits = Limits(spec.resources.cpu, spec.resources.memory)
        group, degraded = self._cgroups.make(self.cgroup_name(job, uid, number), limits)
        try:
            if group is not None:
                identity = self._spawn(spec, env, run_dir, join=group.join_files)
            else:
                kib = -(-limits.memory // 1024) if limits.memory else None
                identity = self._spawn(spec, env, run_dir, address_space_kib=kib)
        except ForkServerUnsure:
            # the run may have started (its cgroup kept for it): the step errs and, next time,
            # looks for the run before it starts it again
            log.warning("run %d of job %s: its start is not known; looked for again", number, job, exc_info=True)
            raise
        except Exception as exc:
            if group is not None:
                group.remove()
            if isinstance(exc, StartFailed):
                raise
            # a full disk, a run dir in the way, a process limit
            log.warning("run %d of job %s could not start", number, job, exc_info=True)
            raise StartFailed(f"cannot start run: {exc}") from exc
        self.trim_logs(run_dir, spec.kept_log_bytes)
        self.watch(job, identity)
        if group is not None:
            return Started(identity, group.name, f"cgroup {group.version}")
        return Started(identity, None, "rlimit", degraded)

    def existing_cgroup(self, job: str, uid: str, number: int) -> str | None:
        """The run's cgroup if it was made (a run spawned before a crash, adopted now)."""
        name = self.cgroup_name(job, uid, number)
        return name if self._cgroups.exists(name) else None

    def usage(self, cgroup: str | None) -> Usage | None:
        """What the run's cgroup counted: peak memory, CPU seconds, OOM kills."""
        return self._cgroups.usage(cgroup)

    def remove_cgroup(self, cgroup: str | None) -> bool:
        """The run is over and its cgroup empty: removed (False while a process is left)."""
        return self._cgroups.remove(cgroup)

    def _spawn(
        self,
        spec: JobSpec,
        env: dict[str, str],
        run_dir: Path,
        *,
        join: list[Path] | None = None,
        address_space_kib: int | None = None,
    ) -> ProcessIdentity:
        if spec.artifact is not None:  # the unpacked folder, or a relative workingDir in it
            cwd = os.path.join(run_dir / WORK, spec.working_dir or "")
        else:
            cwd = spec.working_dir or os.getcwd()
        return spawn_run(
            argv=spec.command,
            shell=spec.shell,
            env=env,
            cwd=cwd,
            run_dir=run_dir,
            fsync_exit=False,
            join=join,
            address_space_kib=address_space_kib,
            wrapper=self._wrapper_binary(),
            server=self._fork_server(),
        )

    def _wrapper_binary(self) -> Path | None:
        """The C wrapper, or None for the sh one (also from now on, should the binary have
        been removed from the state folder: a run must not fail for want of it)."""
        binary = self.wrapper.path
        if binary is not None and not os.access(binary, os.X_OK):
            log.warning("the C run wrapper %s is gone: runs use the sh wrapper", binary)
            self.wrapper.path = binary = None
        return binary

    def _fork_server(self) -> ForkServer | None:
        """The C wrapper's fork server, once the binary is there (RECONCILER_FORK_SERVER=0: every
        run exec's its own wrapper, as before)."""
        binary = self.wrapper.path
        if binary is None or os.environ.get(FORK_SERVER_ENV) == "0":
            return None
        with self._server_lock:
            if self._server is None or self._server.binary != binary:
                locks = self.state_dir / FORK_SERVERS
                make_private_dirs(locks)
                room = len(str(self.state_dir)) + TITLE_MARGIN  # the copies' titles name their run dirs
                self._server = ForkServer(binary, locks, title_room=room)
            return self._server

    def prepare(self, job: str, run_dir: Path, artifact: Artifact) -> Preparation:
        """Fetch a run's artifact (once per sha256, into the cache beside `runs/`) and unpack
        it into the run's folder, in the agent's own threads: answers at once, and calls
        `on_exit(job)` when the folder is ready or cannot be. Call again until the answer is
        ready (then `start`) or failed."""
        return self._artifacts_made().prepare(job, run_dir, artifact.url, artifact.sha256)

    def remove_runs(self, job: str, uid: str, numbers: list[int]) -> None:
        """Remove the folders of these ended runs (logs and all), in the background: their
        job was deleted, or their records are gone from its status (a service's oldest)."""
        if not self._legacy_runs:  # folders of the earlier layout are left as they are
            self._folders.remove([self.run_dir(job, uid, n) for n in numbers])

    def remove_job_runs(self, job: str, uid: str) -> None:
        """Remove every folder of the job's runs here (it was deleted), in the background."""
        if not self._legacy_runs:  # folders of the earlier layout are left as they are
            self._folders.remove_named(self.state_dir / "runs", f"{job}.{uid}.")

    def discard_work(self, run_dir: Path) -> None:
        """The run is over, or will never start: its unpacked folder, if any, is removed (in
        the background)."""
        if self._artifacts is None and not os.path.lexists(run_dir / WORK):
            return  # the common case, a run without an artifact: one stat
        self._artifacts_made().discard(run_dir)

    def _artifacts_made(self) -> Artifacts:
        """The artifact cache and its threads, made on first use: importing and starting them
        is a cost of `up` that runs without artifacts need not pay."""
        with self._artifacts_lock:
            if self._artifacts is None:
                from .artifacts import Artifacts

                self._artifacts = Artifacts(self.state_dir, wake=self._on_exit)
            return self._artifacts

    def watch(self, job: str, identity: ProcessIdentity) -> None:
        if identity not in self._watched:
            self._watched.add(identity)

            def exited(ident: ProcessIdentity) -> None:
                self._watched.discard(ident)
                self._on_exit(job)

            self._watcher.watch(identity, exited)

    def trim_logs(self, run_dir: Path, limit: int) -> None:
        """Keep a live run's stdout and stderr within `limit` bytes each, newest kept, from
        now on (again for a run adopted after a restart: runs outlive the controller)."""
        self._logs.keep(run_dir, limit)

    def stop_trimming(self, run_dir: Path) -> None:
        """The run is over: its logs are trimmed once more, for what it wrote last, and then
        left as they are."""
        self._logs.release(run_dir)

    def find(self, run_dir: Path) -> ProcessIdentity | None:
        """A live wrapper started for `run_dir` (after a crash between spawn and record).
        The wrapper's argv names its run dir, so a stranger is never mistaken for it; and the
        wrapper leads its own process group, which tells it from its forked children (they
        carry its argv until they exec the command or `sync`)."""
        if not run_dir.exists():
            return None  # spawn creates the run dir first: no dir, no process
        if self._artifacts is not None and self._artifacts.preparing(run_dir):
            # its artifact is unpacked into it, and this process, which holds its spawn, has
            # not spawned it yet (it does once prepare answers ready): no look at every process
            return None
        # a run asked of a fork server that is gone (a dead agent's, or this one's after no
        # answer) is findable once that server's lock is free
        wait_for_servers(self.state_dir / FORK_SERVERS)
        target = str(run_dir.absolute())  # as spawn_run gave it to the wrapper
        for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
            cmd = proc.info.get("cmdline") or []
            if len(cmd) > 4 and cmd[3] == WRAPPER_NAME and cmd[4] == target:
                try:
                    if os.getpgid(proc.info["pid"]) != proc.info["pid"]:
                        continue
                except ProcessLookupError:
                    continue
                return ProcessIdentity(proc.info["pid"], proc.info["create_time"])
        return None

    @staticmethod
    def started_at(identity: ProcessIdentity) -> float:
        """Wall-clock start of a found process (an adopted run's startedAt)."""
        return wall_clock_start(identity)

    @staticmethod
    def port_free(port: int) -> bool:
        """Whether nothing listens on `port` on this node."""
        return port_free(port)

    @staticmethod
    def note_stderr(run_dir: Path, line: str) -> None:
        """Append a line of our own to a run's stderr (e.g. why it was stopped)."""
        try:  # private, as every file of a run dir, if the wrapper has not made it yet
            fd = os.open(run_dir / "stderr", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            with open(fd, "a") as err:
                err.write(line + "\n")
        except OSError:
            pass  # the run's log is gone (deleted by hand): nothing to add it to

    @staticmethod
    def exit_of(run_dir: Path) -> ExitRecord | None:
        return read_exit(run_dir)

    def alive(self, identity: ProcessIdentity, cgroup: str | None = None) -> bool:
        """A process of the run lives: its wrapper, anything left in its group or, with a
        cgroup, anything in it (a process that left the group with setsid is still there)."""
        if is_alive(identity) or group_alive(identity):
            return True
        group = self._cgroups.get(cgroup)
        return group is not None and bool(group.pids())

    @staticmethod
    def wrapper_alive(identity: ProcessIdentity) -> bool:
        """The run's wrapper itself lives (then its end can be watched)."""
        return is_alive(identity)

    def leftovers(self, identity: ProcessIdentity, cgroup: str | None = None) -> bool:
        """Processes of the run other than its wrapper: in its group or in its cgroup."""
        if any(pid != identity.pid for pid in group_pids(identity)):
            return True
        group = self._cgroups.get(cgroup)
        return group is not None and any(pid != identity.pid for pid in group.pids())

    def terminate(self, identity: ProcessIdentity, cgroup: str | None = None) -> None:
        """SIGTERM to the run's group, and to the processes of its cgroup outside the group
        (each process gets it once)."""
        signal_group(identity, signal.SIGTERM)
        group = self._cgroups.get(cgroup)
        if group is not None:
            for pid in group.pids():
                _signal_outside(pid, identity.pid, signal.SIGTERM)

    def kill(self, identity: ProcessIdentity, cgroup: str | None = None, *, wrapper_too: bool = False) -> None:
        """SIGKILL the run's group and cgroup but the wrapper, which then records the status.
        Only a wrapper that stayed alive long after its command died (`wrapper_too`) is
        killed too."""
        killed = kill_group_except_wrapper(identity)
        group = self._cgroups.get(cgroup)
        if group is not None:
            killed += group.signal(signal.SIGKILL, spare=identity.pid)
        if killed == 0 and wrapper_too:
            signal_group(identity, signal.SIGKILL)
            if group is not None:
                group.kill_all()

    def close(self) -> None:
        self._cgroups.close()
        if self._server is not None:
            self._server.close()
        self._watcher.close()
        self._logs.close()
        self._folders.close()
        with self._artifacts_lock:
            artifacts = self._artifacts
        if artifacts is not None:
            artifacts.close()


def _signal_outside(pid: int, pgid: int, sig: int) -> None:
    """`sig` to `pid` unless it is in process group `pgid` (which was signalled whole)."""
    try:
        if os.getpgid(pid) != pgid:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass
