"""Figure 16, what a run's cgroup costs: runs of `/bin/true` started through the run wrapper
(`spawn_run`) without a cgroup, as before, against the same with one as the agent makes it
(with the job defaults; on v1 `Spares.take`: a cgroup made ahead by the spares thread,
renamed; on v2, which cannot rename one, made at the start; the wrapper joining it; `remove`
after the exit), interleaved in rounds in this one process. Per
run: the controller's side (take + spawn, then remove once the wrapper has exited) and the
whole run (start to the wrapper reaped, which includes the wrapper's joins). The notes add
what the spares thread spends beside the loop: making a cgroup, per run; and a join's latency
right after another join and after 50 ms without one (the kernel's lock on migrations may wait
for an RCU grace period then: a run started after a quiet spell pays it). Aim (issue 11): at
most 0.5 ms more per run. Needs a writable cgroup hierarchy (root); elsewhere the row says
why there is no figure.

    .venv/bin/python bench/cgroups.py --runs 200 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, discard, log

AIM_MS = 0.5
FIGURE = "16 run start with a cgroup"


def _one(work: Path, index: int, take, limits) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Seconds of one run of /bin/true: taking its cgroup, spawning, removing the cgroup after
    the exit, and the whole run (start to the wrapper reaped)."""
    from reconciler.agent.process import reap, spawn_run

    run_dir = work / f"run-{index}"
    t0 = time.perf_counter()
    group = take(f"bench.{uuid.uuid4()}.1", limits) if take is not None else None
    t1 = time.perf_counter()
    identity = spawn_run(
        argv=["/bin/true"],
        env={},
        cwd=str(work),
        run_dir=run_dir,
        fsync_exit=False,
        join=group.join_files if group is not None else None,
    )
    t2 = time.perf_counter()
    while reap(identity) is None:
        time.sleep(0.0001)
    t3 = time.perf_counter()
    if group is not None and not group.remove():
        raise RuntimeError(f"the cgroup {group.name} could not be removed after its run")
    t4 = time.perf_counter()
    discard(run_dir)
    return {"take": t1 - t0, "spawn": t2 - t1, "remove": t4 - t3, "whole": t4 - t0}


def _join_cost(hierarchy, limits, runs: int, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """What the wrapper's joins add before the command starts: a `/bin/sh` joining each of a
    run's cgroup's `join_files` as the sh wrapper does (0 to a v1 `tasks`, its pid to a
    `cgroup.procs`), against the same writes to /dev/null, interleaved (median difference,
    seconds)."""
    group = hierarchy.create(f"bench.{uuid.uuid4()}.1", limits)
    from reconciler.agent.wrapper import JOIN

    script = f"g=$1\n{JOIN}"
    targets = {"join": " ".join(str(p) for p in group.join_files), "null": " ".join("/dev/null" for _ in group.dirs)}
    times: dict[str, list[float]] = {"join": [], "null": []}
    try:
        for r in range(rounds):
            for mode in ("join", "null") if r % 2 == 0 else ("null", "join"):
                for _ in range(runs):
                    t0 = time.perf_counter()
                    subprocess.run(["/bin/sh", "-c", script, "sh", targets[mode]], check=True)
                    times[mode].append(time.perf_counter() - t0)
    finally:
        group.remove()
    return statistics.median(times["join"]) - statistics.median(times["null"])


IDLE = 0.05  # seconds without a cgroup change before a join: a run started after a quiet spell


def _join_after_idle(hierarchy, limits, runs: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """A join's latency right after the previous one and after IDLE seconds with none, two
    ways: as the wrapper joins (`self`: a child writes to the `join_files` of a fresh run
    cgroup itself, 0 to a v1 `tasks`, timed in the child) and as it joined before 2026-12-07
    (`pid`: the child's pid written to each `cgroup.procs`). A pid written to `cgroup.procs`
    takes the kernel's lock on process migrations (cgroup_threadgroup_rwsem), which waits for
    an RCU grace period when no migration came shortly before, unless a hierarchy is mounted
    favordynmods; a thread moving itself through v1's `tasks` skips it (Linux 5.17 and
    later). Medians, seconds, keyed "<way> back to back" and "<way> after idle". The pause is
    the scenario measured, not a wait for a condition."""
    times: dict[str, list[float]] = {}
    for i in range(4 * runs):
        # each way's "back to back" join follows one of its own (a join through `tasks` does
        # not keep the kernel's lock warm for the next through `cgroup.procs`)
        way, when = ("self", "pid")[i // 2 % 2], ("after idle", "back to back")[i % 2]
        group = hierarchy.create(f"bench.{uuid.uuid4()}.1", limits)
        try:
            times.setdefault(f"{way} {when}", []).append(_join_once(group, way, when == "after idle"))
        finally:
            group.remove()
    return {key: statistics.median(xs) for key, xs in times.items()}


def _join_once(group, way: str, idle: bool) -> float:  # type: ignore[no-untyped-def]
    """Seconds of one join of a forked child into `group`: made by the child itself (`self`,
    timed in the child) or by this process writing the child's pid (`pid`). The child exits
    once the parent closes its end of the pipe, whatever happened on either side."""
    import os

    go_r, go_w = os.pipe()
    took_r, took_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(go_w)
            os.close(took_r)
            os.read(go_r, 1)  # let go (or the parent gone)
            t0 = time.perf_counter()
            if way == "self":
                for path in group.join_files:
                    fd = os.open(path, os.O_WRONLY)
                    try:
                        os.write(fd, b"0\n" if path.name == "tasks" else f"{os.getpid()}\n".encode())
                    finally:
                        os.close(fd)
            os.write(took_w, f"{time.perf_counter() - t0}".encode())
            os.read(go_r, 1)  # until the parent has looked: the cgroup is removed after it
        finally:
            os._exit(0)
    os.close(go_r)
    os.close(took_w)
    try:
        if idle:
            time.sleep(IDLE)
        t0 = time.perf_counter()
        if way == "pid":
            for d in group.dirs:
                (d / "cgroup.procs").write_text(f"{pid}\n")
        took = time.perf_counter() - t0
        os.write(go_w, b"x")
        child_took = os.read(took_r, 64)
        if not child_took:
            raise RuntimeError(f"the child could not join {group.name} ({way})")
        return took if way == "pid" else float(child_took)
    finally:
        os.close(go_w)  # the child's last read ends
        os.close(took_r)
        os.waitpid(pid, 0)


def measure(runs: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds per run of each part, for `plain` and `cgroup` runs, and what the
    spares thread spends per run beside the loop (`ahead`)."""
    from reconciler.agent.cgroups import Limits, detect
    from reconciler.agent.cgroupspares import Spares

    hierarchy = detect()
    # as the agent takes a run's cgroup: a spare renamed on v1, made at the start on v2 (no rename)
    spares = Spares(hierarchy) if hierarchy.renames else None
    take = spares.take if spares is not None else hierarchy.create
    limits = Limits(cpu=1.0, memory=512 << 20)  # a run job's defaults
    samples: dict[str, list[dict[str, float]]] = {"plain": [], "cgroup": []}
    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-cgroups-"))
    try:
        _one(work, -1, take, limits)  # warm: the parent cgroup made, the spares thread started
        for r in range(rounds):
            for mode in ("plain", "cgroup") if r % 2 == 0 else ("cgroup", "plain"):
                samples[mode] += [_one(work, i, take if mode == "cgroup" else None, limits) for i in range(runs)]
        made = []  # the spares thread's work per run: a cgroup made with the runs' limits (and removed)
        for _ in range(runs):
            t0 = time.perf_counter()
            hierarchy.create(f"bench.{uuid.uuid4()}.1", limits).remove()
            made.append(time.perf_counter() - t0)
        join = _join_cost(hierarchy, limits, runs, rounds)
        idle = _join_after_idle(hierarchy, limits, min(runs, 40))
    finally:
        if spares is not None:
            spares.close()
        discard(work)
    result = {m: {k: statistics.median(x[k] for x in xs) for k in xs[0]} for m, xs in samples.items()}
    result["cgroup"]["ahead"] = statistics.median(made)
    result["cgroup"]["join"] = join
    for key, seconds in idle.items():
        result["cgroup"][f"join {key}"] = seconds
    result["cgroup"]["version"] = 2.0 if hierarchy.version == "v2" else 1.0
    return result


def row(runs: int, rounds: int) -> Row:
    from reconciler.agent.cgroups import CgroupUnavailable

    log(f"cgroups: {rounds} rounds of {runs} runs with and without a cgroup")
    try:
        m = measure(runs, rounds)
    except CgroupUnavailable as exc:
        return Row(FIGURE, "no cgroup here", "-", None, "ms", None, [f"16 cgroups: not measured: {exc}"])
    c, p = m["cgroup"], m["plain"]
    version = "v2" if c["version"] == 2.0 else "v1"
    # what a cgroup adds to a run's start and end: on the loop's path (take, remove) and in
    # the wrapper before the command starts (its joins)
    added = (c["take"] + c["remove"] + max(0.0, c["join"])) * 1000
    note = (
        f"16 cgroups ({version}): medians of {rounds} x {runs} runs of /bin/true each way, interleaved; on the "
        f"loop's path a cgroup adds take {c['take'] * 1000:.3f} ms + remove {c['remove'] * 1000:.3f} ms; the "
        f"wrapper's joins add {c['join'] * 1000:.3f} ms before the command starts (sh joining the "
        f"{'tasks files (0)' if version == 'v1' else 'cgroup.procs file (its pid)'} against writes to /dev/null); "
        f"spawn "
        f"{c['spawn'] * 1000:.2f} ms with the joins in the wrapper's argv against {p['spawn'] * 1000:.2f} ms; the "
        f"whole run (start to the wrapper reaped and its cgroup removed) {c['whole'] * 1000:.2f} ms against "
        f"{p['whole'] * 1000:.2f} ms; "
        + ("beside the loop, the spares thread spends" if version == "v1" else "no spares on v2 (no rename): the take")
        + f" {c['ahead'] * 1000:.2f} ms a run making a cgroup (timed as make with the limits + remove; a v1 spare"
        " is made with the last run's limits, so that a run with the same writes none at its take); "
        f"a join as the wrapper makes it (the process writing {'0 to each tasks' if version == 'v1' else 'its pid'}) "
        f"takes {c['join self back to back'] * 1000:.2f} ms right after another and "
        f"{c['join self after idle'] * 1000:.2f} ms after {IDLE * 1000:.0f} ms without one; a pid written to each "
        f"cgroup.procs (the way before) {c['join pid back to back'] * 1000:.2f} ms and "
        f"{c['join pid after idle'] * 1000:.2f} ms (medians): a run started after a quiet spell waits that long "
        "before its command starts"
    )
    return Row(
        f"{FIGURE} ({version})",
        f"+{added:.2f} ms a run (take, join, remove)",
        f"spawn alone {p['spawn'] * 1000:.2f} ms",
        added,
        "ms",
        AIM_MS,
        [note],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = row(args.runs, args.rounds)
    print(f"{result.figure}: {result.reconciler} ({result.reference})")
    for note in result.notes:
        print(note)


if __name__ == "__main__":
    main()
