"""The cgroup module: v2 against a fake hierarchy in a temp dir (files where the kernel keeps
its interface files), v1 against this machine's real hierarchy (root, cgroup v1), with real
processes joined by the run wrapper."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import uuid
from pathlib import Path

import pytest

from reconciler.agent import cgroups
from reconciler.agent.cgroups import (
    NO_LIMITS,
    CgroupUnavailable,
    Limits,
    V1Hierarchy,
    V2Hierarchy,
    detect,
)
from reconciler.agent.cgroupspares import Spares
from reconciler.agent.local import LocalAgent
from reconciler.agent.process import read_exit
from reconciler.api.job import JobSpec
from tests.helpers import wait_until

MiB = 1024 * 1024


# -- v2, on a fake hierarchy ------------------------------------------------------------------
@pytest.fixture
def fake_v2(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_v2_is_chosen_where_the_unified_hierarchy_offers_memory_and_cpu(fake_v2):
    assert isinstance(detect(fake_v2), V2Hierarchy)


def test_a_v2_hierarchy_without_the_memory_controller_is_refused_by_name(fake_v2):
    (fake_v2 / "cgroup.controllers").write_text("cpu io pids\n")
    with pytest.raises(CgroupUnavailable, match="memory controller"):
        detect(fake_v2)


def test_v2_create_enables_the_controllers_on_the_way_and_writes_the_limits(fake_v2):
    group = detect(fake_v2).create("job.uid.1", Limits(cpu=0.2, memory=64 * MiB))
    parent = fake_v2 / "reconciler"
    assert (fake_v2 / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert group.dirs == (parent / "job.uid.1",)
    assert (parent / "job.uid.1" / "memory.max").read_text() == str(64 * MiB)
    assert (parent / "job.uid.1" / "cpu.max").read_text() == "20000 100000"
    assert group.join_files == [parent / "job.uid.1" / "cgroup.procs"]


def test_v2_gives_a_cgroup_found_made_every_limit_over_what_it_holds(fake_v2):
    hier = detect(fake_v2)
    group = hier.create("a.b.1", Limits(cpu=0.5, memory=64 * MiB))
    (group.dirs[0] / "memory.swap.max").write_text("0")
    hier.create("a.b.1", NO_LIMITS)  # found made (a crash): what it holds is not known
    files = {f: (group.dirs[0] / f).read_text() for f in ("memory.max", "memory.swap.max", "cpu.max")}
    assert files == {"memory.max": "max", "memory.swap.max": "max", "cpu.max": "max 100000"}
    hier.create("a.b.1", Limits(cpu=2, memory=MiB))
    files = {f: (group.dirs[0] / f).read_text() for f in ("memory.max", "memory.swap.max", "cpu.max")}
    assert files == {"memory.max": str(MiB), "memory.swap.max": "0", "cpu.max": "200000 100000"}


def test_v2_leaves_controllers_already_enabled_alone(fake_v2):
    (fake_v2 / "cgroup.subtree_control").write_text("cpu memory pids\n")
    detect(fake_v2).create("a.b.1", Limits(cpu=1, memory=MiB))
    assert (fake_v2 / "cgroup.subtree_control").read_text() == "cpu memory pids\n"


def test_v2_without_limits_writes_none(fake_v2):
    group = detect(fake_v2).create("a.b.1", Limits(cpu=None, memory=0))
    assert not (group.dirs[0] / "memory.max").exists()
    assert not (group.dirs[0] / "cpu.max").exists()


def test_v2_usage_reads_peak_cpu_time_and_oom_kills(fake_v2):
    group = detect(fake_v2).create("a.b.1", Limits(cpu=1, memory=MiB))
    path = group.dirs[0]
    (path / "memory.peak").write_text("123456789\n")
    (path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n")
    usage = group.usage()
    assert (usage.peak_memory, usage.cpu_seconds, usage.oom_kills) == (123456789, 2.5, 1)


def test_v2_usage_without_memory_peak_says_unknown(fake_v2):
    group = detect(fake_v2).create("a.b.1", Limits(cpu=1, memory=MiB))
    (group.dirs[0] / "memory.events").write_text("oom 0\noom_kill 0\n")
    assert group.usage().peak_memory is None and group.usage().oom_kills == 0


def test_v2_pids_and_kill_all_through_cgroup_kill(fake_v2):
    group = detect(fake_v2).create("a.b.1", Limits(cpu=1, memory=MiB))
    (group.dirs[0] / "cgroup.procs").write_text("12\n7\n")
    (group.dirs[0] / "cgroup.kill").write_text("")
    assert group.pids() == [7, 12]
    group.kill_all()
    assert (group.dirs[0] / "cgroup.kill").read_text() == "1"


def test_v2_create_fails_cleanly_where_the_parent_cannot_be_made(fake_v2):
    (fake_v2 / "reconciler").write_text("")  # as a read-only hierarchy would: nothing can go there
    with pytest.raises(CgroupUnavailable, match=str(fake_v2)):
        detect(fake_v2).create("a.b.1", Limits(cpu=1, memory=MiB))


def test_opening_a_cgroup_that_is_gone_reads_as_empty(fake_v2):
    group = detect(fake_v2).open("never.made.1")
    assert not group.exists() and group.pids() == [] and group.remove()
    assert group.usage().oom_kills == 0


@pytest.mark.parametrize("name", ["", "..", "a/b", "a b", "a*b"])
def test_names_the_wrapper_could_not_join_are_refused(fake_v2, name):
    with pytest.raises(CgroupUnavailable):
        detect(fake_v2).create(name, Limits(cpu=1, memory=MiB))


def _real_v1() -> V1Hierarchy | None:
    try:
        hier = detect()
    except CgroupUnavailable:
        return None
    return hier if isinstance(hier, V1Hierarchy) and os.access(hier.memory, os.W_OK) else None


real_v1 = pytest.mark.skipif(_real_v1() is None, reason="needs a writable cgroup v1 hierarchy (the CI machine's)")


# -- spares: cgroups made ahead, renamed at a run's start (v1: cgroup2 renames none) ----------
def _spares_in(parent: Path) -> list[str]:
    """This process's spares: a controller running beside the tests has its own."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f"spare-{os.getpid()}-"))


def _unique(job: str) -> str:
    return f"{job}.{uuid.uuid4()}.1"  # cgroups are machine-wide: one name per test run


@real_v1
def test_a_run_takes_a_spare_by_renaming_it_and_the_thread_makes_another():
    hier = _real_v1()
    assert hier is not None
    spares = Spares(hier, keep=2)
    parent = hier.memory / "reconciler"
    taken = []
    try:
        taken.append(spares.take(_unique("first"), Limits(cpu=1, memory=MiB)))  # none ready yet: made at once
        wait_until(lambda: spares.ready() == 2, timeout=10)
        before = _spares_in(parent)
        name = _unique("job")
        group = spares.take(name, Limits(cpu=0.5, memory=2 * MiB))
        taken.append(group)
        assert group.dirs == hier.open(name).dirs and all(d.is_dir() for d in group.dirs)
        assert (hier.memory / "reconciler" / name / "memory.limit_in_bytes").read_text().strip() == str(2 * MiB)
        assert (hier.cpu / "reconciler" / name / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert len(set(before) - set(_spares_in(parent))) == 1, "the run's cgroup is a spare renamed"
        wait_until(lambda: spares.ready() == 2, timeout=10)
    finally:
        spares.close()
        for group in taken:
            group.remove()
    assert not set(_spares_in(parent)) & set(before), "closing removes the spares left"


def _held(hier: V1Hierarchy, name: str) -> tuple[int | None, int | None, int | None]:
    """What a v1 cgroup holds: its memory limit, its memory+swap limit (None without swap
    accounting) and its CPU quota; None for no limit."""
    memory, cpu = hier.memory / "reconciler" / name, hier.cpu / "reconciler" / name

    def limit(path: Path) -> int | None:
        value = int(path.read_text())
        return None if value < 0 or value >= 2**62 else value  # -1 reads back as the largest page count

    memsw = memory / "memory.memsw.limit_in_bytes"
    quota = limit(cpu / "cpu.cfs_quota_us")
    assert quota is None or (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    return limit(memory / "memory.limit_in_bytes"), limit(memsw) if memsw.exists() else None, quota


MEMSW, RAM, PERIOD, QUOTA = (
    "memory.memsw.limit_in_bytes",
    "memory.limit_in_bytes",
    "cpu.cfs_period_us",
    "cpu.cfs_quota_us",
)


@real_v1
def test_a_spare_is_made_with_the_last_runs_limits_and_a_run_writes_only_those_that_differ(monkeypatch, caplog):
    hier = _real_v1()
    assert hier is not None
    swap = (hier.memory / MEMSW).exists()
    written: list[Path] = []
    write = cgroups._write
    monkeypatch.setattr(cgroups, "_write", lambda path, value: (written.append(path), write(path, value))[1])
    spares = Spares(hier, keep=1)
    parent = hier.memory / "reconciler"
    taken = []

    def take(limits: Limits, writes: list[str]) -> tuple[int | None, int | None, int | None]:
        wait_until(lambda: spares.ready() == 1, timeout=10)
        [spare] = _spares_in(parent)
        written.clear()
        with caplog.at_level(logging.WARNING, logger="reconciler.agent.cgroupspares"):
            group = spares.take(_unique("job"), limits)
        taken.append(group)
        assert caplog.records == [] and spare not in _spares_in(parent), "the run's cgroup is the spare renamed"
        # its own writes, in order (not the next spare's, which the thread may be making)
        assert [p.name for p in written if group.name in p.parts] == [w for w in writes if swap or w != MEMSW]
        return _held(hier, group.name)

    try:
        first = Limits(cpu=1, memory=2 * MiB)
        taken.append(spares.take(_unique("first"), first))  # none ready yet: made at once
        wait_until(lambda: spares.ready() == 1, timeout=10)
        assert _held(hier, _spares_in(parent)[0]) == (2 * MiB, 2 * MiB if swap else None, 100_000)
        assert take(first, []) == (2 * MiB, 2 * MiB if swap else None, 100_000)
        # more memory (the memory+swap limit first, which the RAM limit may not exceed), less CPU
        more = take(Limits(cpu=0.5, memory=8 * MiB), [MEMSW, RAM, QUOTA])
        assert more == (8 * MiB, 8 * MiB if swap else None, 50_000)
        # less memory (the RAM limit first), no CPU quota
        assert take(Limits(cpu=None, memory=MiB), [RAM, MEMSW, QUOTA]) == (MiB, MiB if swap else None, None)
        # no limits at all: a spare made with some gives them up
        assert take(NO_LIMITS, [MEMSW, RAM]) == (None, None, None)
        assert take(Limits(cpu=2, memory=None), [PERIOD, QUOTA]) == (None, None, 200_000)
    finally:
        spares.close()
        for group in taken:
            group.remove()


@real_v1
def test_a_runs_cgroup_found_holding_another_runs_limits_is_given_its_own():
    # a crash between a spare's rename and the writes of the run's limits leaves the run's
    # cgroup with the limits the spare was made with: the next start finds it and creates it
    hier = _real_v1()
    assert hier is not None
    swap = (hier.memory / MEMSW).exists()
    name = _unique("job")
    hier.create(_unique("parent-made"), NO_LIMITS).remove()  # the parent folders are there
    try:
        hier.create(name, Limits(cpu=1, memory=8 * MiB))
        assert _held(hier, hier.create(name, NO_LIMITS).name) == (None, None, None)
        hier.create(name, Limits(cpu=1, memory=8 * MiB))
        raised = hier.create(name, Limits(cpu=0.5, memory=16 * MiB))  # past the memory+swap limit it held
        assert _held(hier, raised.name) == (16 * MiB, 16 * MiB if swap else None, 50_000)
        assert _held(hier, hier.create(name, Limits(cpu=None, memory=4 * MiB)).name) == (
            4 * MiB,
            4 * MiB if swap else None,
            None,
        )
        # limits half written: the RAM limit the run's, the memory+swap one another's or none
        if swap:
            for other in (Limits(cpu=None, memory=8 * MiB), NO_LIMITS):
                hier.create(name, other)
                (hier.memory / "reconciler" / name / RAM).write_text(str(4 * MiB))
                assert _held(hier, name)[:2] == (4 * MiB, 8 * MiB if other.memory else None)
                found = hier.create(name, Limits(cpu=None, memory=4 * MiB))
                assert _held(hier, found.name) == (4 * MiB, 4 * MiB, None)
        # found in some hierarchies only (a crash between the mkdirs or the renames)
        for d in hier.create(name, Limits(cpu=1, memory=8 * MiB)).dirs[1:]:
            d.rmdir()
        assert _held(hier, hier.create(name, NO_LIMITS).name) == (None, None, None)
        # through a take: the spare cannot become it, and the one found is given the run's limits
        hier.create(name, Limits(cpu=1, memory=8 * MiB))
        spares = Spares(hier, keep=1)
        warm = spares.take(_unique("warm"), Limits(cpu=1, memory=8 * MiB))
        try:
            wait_until(lambda: spares.ready() == 1, timeout=10)
            assert _held(hier, spares.take(name, NO_LIMITS).name) == (None, None, None)
        finally:
            spares.close()
            warm.remove()
    finally:
        hier.open(name).remove()


@real_v1
def test_limits_the_kernel_refuses_do_not_stop_the_spares(monkeypatch):
    hier = _real_v1()
    assert hier is not None
    parent = hier.memory / "reconciler"
    refused: set[tuple[str, str]] = set()  # (value, whose): v1 answers EINVAL to a quota over its parent's
    write = cgroups._write

    def refusing(path: Path, value: str) -> None:
        whose = "spare" if path.parent.name.startswith("spare-") else "run"
        if path.name == QUOTA and (value, whose) in refused:
            raise OSError(errno.EINVAL, "Invalid argument")
        write(path, value)

    monkeypatch.setattr(cgroups, "_write", refusing)
    spares = Spares(hier, keep=1)
    taken = []
    try:
        taken.append(spares.take(_unique("first"), Limits(cpu=1, memory=None)))
        wait_until(lambda: spares.ready() == 1, timeout=10)
        refused.update({("200000", "run"), ("200000", "spare")})
        with pytest.raises(CgroupUnavailable):
            spares.take(_unique("refused"), Limits(cpu=2, memory=None))
        # the next spare is made with the limits last written, not those refused
        wait_until(lambda: spares.ready() == 1, timeout=10)
        assert _held(hier, _spares_in(parent)[0])[2] == 100_000
        # limits a run was given and a spare then is refused (the parent's quota lowered since):
        # the spare is made without them, and the thread goes on
        refused.add(("50000", "spare"))
        taken.append(spares.take(_unique("job"), Limits(cpu=0.5, memory=None)))
        wait_until(lambda: spares.ready() == 1, timeout=10)
        assert _held(hier, _spares_in(parent)[0]) == (None, None, None)
        taken.append(spares.take(_unique("job"), Limits(cpu=0.5, memory=None)))
        wait_until(lambda: spares.ready() == 1, timeout=10)
    finally:
        spares.close()
        for group in taken:
            group.remove()


@real_v1
def test_a_run_whose_cgroup_exists_keeps_it_and_the_spare_goes_without_a_warning(caplog):
    hier = _real_v1()
    assert hier is not None
    name = _unique("job")
    made = hier.create(name, Limits(cpu=1, memory=MiB))  # made before a crash, before its spawn
    spares = Spares(hier, keep=1)
    parent = hier.memory / "reconciler"
    warm = None
    try:
        warm = spares.take(_unique("warm"), Limits(cpu=1, memory=MiB))
        wait_until(lambda: spares.ready() == 1, timeout=10)
        ready = _spares_in(parent)
        with caplog.at_level(logging.WARNING, logger="reconciler.agent.cgroupspares"):
            group = spares.take(name, Limits(cpu=2, memory=MiB))
        assert group.dirs == made.dirs
        assert (hier.cpu / "reconciler" / name / "cpu.cfs_quota_us").read_text().strip() == "200000"
        assert not set(ready) & set(_spares_in(parent)), "the spare it could not use is removed"
        assert caplog.records == [], "a run's own cgroup found again is no failure to report"
    finally:
        spares.close()
        made.remove()
        if warm is not None:
            warm.remove()


@pytest.fixture
def fake_v1(tmp_path: Path) -> Path:
    for controller, probe in (
        ("memory", "memory.limit_in_bytes"),
        ("cpu", "cpu.cfs_quota_us"),
        ("cpuacct", "cpuacct.usage"),
    ):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / probe).write_text("")
    return tmp_path


def test_spares_of_a_process_that_is_gone_are_swept(fake_v1):
    hier = detect(fake_v1)
    hier.prepare()
    parent = fake_v1 / "memory" / "reconciler"
    gone = 2**22 + 12345  # above pid_max's default ceiling: no such process
    (parent / f"spare-{gone}-abc").mkdir()
    (parent / f"spare-{os.getpid()}-mine").mkdir()
    Spares(hier).sweep()
    assert _spares_in(parent) == [f"spare-{os.getpid()}-mine"]


def _cgroup2_mount() -> Path | None:
    """This machine's cgroup2 filesystem, where a folder can be made in it."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2" and os.access(fields[1], os.W_OK):
            return Path(fields[1])
    return None


@pytest.mark.skipif(_cgroup2_mount() is None, reason="needs a writable cgroup2 mount (the CI machine's)")
def test_cgroup2_refuses_to_rename_a_cgroup_so_v2_makes_no_spares(fake_v2):
    """Why the agent takes no spares on v2: the kernel's cgroup2 filesystem has no rename
    (v1's has), so a spare could never become a run's cgroup there."""
    mount = _cgroup2_mount()
    assert mount is not None
    old, new = mount / f"reconciler-test-{uuid.uuid4().hex[:8]}", mount / f"reconciler-test-{uuid.uuid4().hex[:8]}"
    old.mkdir()
    try:
        with pytest.raises(PermissionError):
            os.rename(old, new)
    finally:
        old.rmdir()
    assert not V2Hierarchy.renames and V1Hierarchy.renames
    with pytest.raises(ValueError, match="cannot rename"):
        Spares(detect(fake_v2))


def test_an_agent_on_v2_makes_each_runs_cgroup_at_its_start(fake_v2, tmp_path):
    agent = LocalAgent("node-a", tmp_path / "state", on_exit=lambda job: None, cgroup_root=fake_v2)
    try:
        assert agent.cgroup_version == "v2"
        uid = str(uuid.uuid4())
        started = agent.start("job", uid, 1, JobSpec.model_validate({"command": ["true"]}), 1)
        run_dir = agent.run_dir("job", uid, 1)
        wait_until(lambda: read_exit(run_dir), timeout=10)
        group = fake_v2 / "reconciler" / started.cgroup
        assert started.limits == "cgroup v2" and (group / "memory.max").read_text() == str(512 * MiB)
        assert (group / "cgroup.procs").read_text().strip() == str(started.identity.pid), "the wrapper joined it"
        assert _spares_in(fake_v2 / "reconciler") == [], "no spare is made where none could be renamed"
    finally:
        agent.close()


def test_an_agent_on_v2_sweeps_the_spares_an_earlier_version_left(fake_v2, tmp_path):
    parent = fake_v2 / "reconciler"
    parent.mkdir()
    gone = 2**22 + 12345  # above pid_max's default ceiling: no such process
    (parent / f"spare-{gone}-abc").mkdir()
    (parent / f"spare-{os.getpid()}-mine").mkdir()
    LocalAgent("node-a", tmp_path / "state", on_exit=lambda job: None, cgroup_root=fake_v2).close()
    assert _spares_in(parent) == [f"spare-{os.getpid()}-mine"]


# -- v1: detection on fake folders, the rest on the real hierarchy ----------------------------
def test_no_hierarchy_is_refused_with_the_place_named(tmp_path):
    with pytest.raises(CgroupUnavailable, match=str(tmp_path)):
        detect(tmp_path)


def test_v1_with_cpu_and_cpuacct_on_one_mount_uses_one_folder_for_both(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("")
    shared = tmp_path / "cpu,cpuacct"
    shared.mkdir()
    (shared / "cpu.cfs_quota_us").write_text("")
    (shared / "cpuacct.usage").write_text("")
    (tmp_path / "cpu").symlink_to(shared)
    (tmp_path / "cpuacct").symlink_to(shared)
    hier = detect(tmp_path)
    assert isinstance(hier, V1Hierarchy)
    assert hier.open("a.b.1").dirs == (
        tmp_path / "memory" / "reconciler" / "a.b.1",
        shared / "reconciler" / "a.b.1",
    )


@pytest.fixture
def v1_group():
    hier = _real_v1()
    assert hier is not None
    group = hier.create(f"test.{uuid.uuid4()}.1", Limits(cpu=0.5, memory=64 * MiB))
    yield group
    group.kill_all()
    wait_until(lambda: not group.pids(), timeout=10)
    assert group.remove()


@real_v1
def test_v1_create_writes_the_memory_limit_and_the_cpu_quota(v1_group):
    assert (v1_group.memory / "memory.limit_in_bytes").read_text().strip() == str(64 * MiB)
    assert (v1_group.cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert (v1_group.cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert v1_group.pids() == [] and v1_group.usage().oom_kills == 0


@real_v1
def test_the_wrapper_joins_the_cgroup_before_the_command_runs(spawn, v1_group, tmp_path):
    """The command reads its own /proc/self/cgroup: it is in the run's cgroup in every
    hierarchy from its first instruction."""
    _identity, run_dir = spawn(argv=["cat", "/proc/self/cgroup"], join=v1_group.join_files)
    wait_until(lambda: read_exit(run_dir), timeout=10)
    lines = (run_dir / "stdout").read_text().splitlines()
    for controller in ("memory", "cpu", "cpuacct"):
        path = next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == controller)
        assert path == f"/reconciler/{v1_group.name}", lines


@real_v1
def test_v1_runs_join_through_tasks_and_are_listed_in_cgroup_procs(spawn, v1_group, tmp_path):
    """On v1 the wrapper joins through each hierarchy's `tasks` (0: its own thread, which the
    kernel moves without the lock every process migration takes); being single-threaded,
    its whole process is then in the cgroup: `cgroup.procs` lists it, as `pids` reads it."""
    assert v1_group.join_files == [d / "tasks" for d in v1_group.dirs]
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    identity, _run_dir = spawn(argv=["cat", str(gate)], join=v1_group.join_files)
    try:
        # the hierarchies are joined one after another: each lists it once joined
        wait_until(
            lambda: all(str(identity.pid) in (d / "cgroup.procs").read_text().split() for d in v1_group.dirs),
            timeout=10,
        )
        assert identity.pid in v1_group.pids()
    finally:
        with contextlib.suppress(OSError):  # lets cat end (ENXIO: it never opened the gate)
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))


@real_v1
def test_v1_finds_kills_and_counts_a_process_that_left_the_group(spawn, v1_group, tmp_path):
    pid_file = tmp_path / "escapee"
    shell = f"setsid sh -c 'echo $$ > {pid_file}; while :; do :; done' & exit 0"
    identity, _run_dir = spawn(shell=shell, join=v1_group.join_files)
    escapee = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=10))
    assert escapee in v1_group.pids()
    assert os.getpgid(escapee) != identity.pid
    wait_until(lambda: v1_group.usage().cpu_seconds > 0.05, timeout=10)
    assert v1_group.signal(signal.SIGKILL, spare=identity.pid) >= 1
    wait_until(lambda: not v1_group.pids(), timeout=10)


@real_v1
def test_v1_counts_an_oom_kill(spawn, v1_group):
    _identity, run_dir = spawn(argv=["python3", "-c", "b = bytearray(200 * 1024 * 1024)"], join=v1_group.join_files)
    record = wait_until(lambda: read_exit(run_dir), timeout=30)
    usage = v1_group.usage()
    assert record.exit_code == 137 and usage.oom_kills == 1
    assert 0 < usage.peak_memory <= 64 * MiB


def test_the_fallback_rlimit_holds_the_command(spawn):
    """`ulimit -v` in the wrapper, in KiB: the command sees it as its RLIMIT_AS."""
    _identity, run_dir = spawn(argv=["cat", "/proc/self/limits"], address_space_kib=256 * 1024)
    wait_until(lambda: read_exit(run_dir), timeout=10)
    line = next(x for x in (run_dir / "stdout").read_text().splitlines() if x.startswith("Max address space"))
    assert line.split()[3] == str(256 * MiB)
