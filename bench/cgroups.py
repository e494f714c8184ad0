"""Figure 13, what a run's cgroup costs: runs of `/bin/true` started through the run wrapper
(`spawn_run`) without a cgroup, as before, against the same with one (`Hierarchy.create`
with the job defaults, the wrapper joining it, `remove` after the exit), interleaved in
rounds in this one process. Per run: the controller's side (create + spawn, then remove once
the wrapper has exited) and the whole run (start to the wrapper reaped, which includes the
wrapper's joins). Aim (issue 11): at most 0.5 ms more per run. Needs a writable cgroup
hierarchy (root); elsewhere the row says why there is no figure.

    .venv/bin/python bench/cgroups.py --runs 200 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, log

AIM_MS = 0.5
FIGURE = "13 run start with a cgroup"


def _one(work: Path, index: int, hierarchy, limits) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(controller-side seconds, whole-run seconds) of one run of /bin/true."""
    from reconciler.agent.process import reap, spawn_run

    run_dir = work / f"run-{index}"
    t0 = time.perf_counter()
    group = hierarchy.create(f"bench.{uuid.uuid4()}.1", limits) if hierarchy is not None else None
    identity = spawn_run(
        argv=["/bin/true"],
        env={},
        cwd=str(work),
        run_dir=run_dir,
        fsync_exit=False,
        join=group.procs_files if group is not None else None,
    )
    t1 = time.perf_counter()
    while reap(identity) is None:
        time.sleep(0.0001)
    t2 = time.perf_counter()
    if group is not None and not group.remove():
        raise RuntimeError(f"the cgroup {group.name} could not be removed after its run")
    t3 = time.perf_counter()
    shutil.rmtree(run_dir)
    return (t1 - t0) + (t3 - t2), t3 - t0


def measure(runs: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds per run, controller side and whole run, for `plain` and `cgroup`."""
    from reconciler.agent.cgroups import Limits, detect

    hierarchy = detect()
    limits = Limits(cpu=1.0, memory=512 << 20)  # a run job's defaults
    samples: dict[str, dict[str, list[float]]] = {m: {"side": [], "whole": []} for m in ("plain", "cgroup")}
    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-cgroups-"))
    try:
        _one(work, -1, hierarchy, limits)  # warm: the parent cgroup made, imports done
        for r in range(rounds):
            for mode in ("plain", "cgroup") if r % 2 == 0 else ("cgroup", "plain"):
                for i in range(runs):
                    side, whole = _one(work, i, hierarchy if mode == "cgroup" else None, limits)
                    samples[mode]["side"].append(side)
                    samples[mode]["whole"].append(whole)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {m: {k: statistics.median(v) for k, v in by.items()} for m, by in samples.items()}
    result["cgroup"]["version"] = 2.0 if hierarchy.version == "v2" else 1.0
    return result


def row(runs: int, rounds: int) -> Row:
    from reconciler.agent.cgroups import CgroupUnavailable

    log(f"cgroups: {rounds} rounds of {runs} runs with and without a cgroup")
    try:
        m = measure(runs, rounds)
    except CgroupUnavailable as exc:
        return Row(FIGURE, "no cgroup here", "-", None, "ms", None, [f"13 cgroups: not measured: {exc}"])
    version = "v2" if m["cgroup"]["version"] == 2.0 else "v1"
    extra = (m["cgroup"]["side"] - m["plain"]["side"]) * 1000
    whole = (m["cgroup"]["whole"] - m["plain"]["whole"]) * 1000
    note = (
        f"13 cgroups ({version}): median of {rounds} x {runs} runs of /bin/true each way, interleaved; controller "
        f"side (create + spawn, remove after the exit) {m['cgroup']['side'] * 1000:.2f} ms with a cgroup against "
        f"{m['plain']['side'] * 1000:.2f} ms without; the whole run (start to the wrapper reaped, its joins "
        f"included) {m['cgroup']['whole'] * 1000:.2f} ms against {m['plain']['whole'] * 1000:.2f} ms "
        f"({whole:+.2f} ms)"
    )
    return Row(
        f"{FIGURE} ({version})",
        f"{m['cgroup']['side'] * 1000:.2f} ms a run",
        f"without {m['plain']['side'] * 1000:.2f} ms",
        extra,
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
    print(f"{result.figure}: {result.reconciler} ({result.reference}); +{result.result_text()} a run")
    for note in result.notes:
        print(note)


if __name__ == "__main__":
    main()
