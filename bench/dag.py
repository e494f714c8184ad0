"""Figure 1 (and 7 on PostgreSQL): DAG throughput.

A layered graph of `/bin/true` jobs (width W, each job below the first layer depends on two
jobs of the layer above) run by the real verb, `reconciler up -f dag.yaml`, as a subprocess
on a fresh store, against the same graph as a Makefile under `make -j N` with the same slot
count N (the `global` Pool). Figure: wall time of `up` (start to exit) / wall time of make.

    .venv/bin/python bench/dag.py                    # 2,000 jobs, width 50, N = nproc, SQLite
    .venv/bin/python bench/dag.py --jobs 100 --width 10 --store pg
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    PYTHON,
    Row,
    byte_compile,
    child_env,
    log,
    make_available,
    median,
    print_table,
    run_make,
    scratch,
)

AIM = 2.0


def job_name(layer: int, i: int) -> str:
    return f"d{layer}-{i}"


def layers_of(jobs: int, width: int) -> list[list[str]]:
    names = [job_name(k // width, k % width) for k in range(jobs)]
    return [names[i : i + width] for i in range(0, jobs, width)]


def parents(layer: int, i: int, above: int) -> list[str]:
    """Two dependencies in the layer above (one when that layer has a single job)."""
    picks = sorted({i % above, (i + 1) % above})
    return [job_name(layer - 1, p) for p in picks]


def manifests(jobs: int, width: int, slots: int) -> str:
    docs = [f"apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {{name: global}}\nspec: {{slots: {slots}}}\n"]
    grid = layers_of(jobs, width)
    for layer, names in enumerate(grid):
        for i, name in enumerate(names):
            deps = f"\n  dependsOn: [{', '.join(parents(layer, i, len(grid[layer - 1])))}]" if layer else ""
            docs.append(
                f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: {name}}}\n"
                f"spec:\n  command: [/bin/true]{deps}\n"
            )
    return "---\n".join(docs)


def node_manifest(slots: int) -> str:
    """Only when N exceeds the local node's default capacity (its CPU count)."""
    from reconciler.controller.nodes import local_node_name

    return (
        f"---\napiVersion: reconciler.dev/v1alpha1\nkind: Node\nmetadata: {{name: {local_node_name()}}}\n"
        f"spec: {{capacity: {{slots: {slots}}}}}\n"
    )


def makefile(jobs: int, width: int) -> str:
    grid = layers_of(jobs, width)
    every = [n for names in grid for n in names]
    lines = [".PHONY: all " + " ".join(every), "all: " + " ".join(every)]
    for layer, names in enumerate(grid):
        for i, name in enumerate(names):
            deps = " ".join(parents(layer, i, len(grid[layer - 1]))) if layer else ""
            lines.append(f"{name}: {deps}\n\t@/bin/true")
    return "\n".join(lines) + "\n"


def dodo(jobs: int, width: int) -> str:
    """The same graph as a doit file: /bin/true without a shell, every task always runs."""
    grid = layers_of(jobs, width)
    tasks = {
        name: parents(layer, i, len(grid[layer - 1])) if layer else []
        for layer, names in enumerate(grid)
        for i, name in enumerate(names)
    }
    return (
        "DOIT_CONFIG = {'verbosity': 0}\n"
        f"TASKS = {tasks!r}\n"
        "def task_dag():\n"
        "    for name, deps in TASKS.items():\n"
        "        yield {'name': name, 'actions': [['/bin/true']], 'uptodate': [False],\n"
        "               'task_dep': [f'dag:{d}' for d in deps]}\n"
    )


def run_doit(folder: Path, slots: int) -> float | None:
    """Wall time of doit on the graph with N threads (`-n N -P thread`), None without doit: a
    Python task runner with no durable state, the reference issue 15 sets the DAG aims by."""
    doit = Path(PYTHON).with_name("doit")
    if not doit.exists():
        return None
    (folder / ".doit.db").unlink(missing_ok=True)
    start = time.perf_counter()
    argv = [
        str(doit),
        "-f",
        str(folder / "dodo.py"),
        "--db-file",
        str(folder / ".doit.db"),
        "-n",
        str(slots),
        "-P",
        "thread",
    ]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=folder)
    return time.perf_counter() - start


def run_up(url: str, folder: Path, manifest: Path, timeout: float, label: str) -> dict:
    """Wall and CPU time of one `reconciler up` process, start to exit."""
    out, err = folder / f"{label}.stdout", folder / f"{label}.stderr"
    argv = [PYTHON, "-m", "reconciler", "--store", url, "up", "-f", str(manifest), "--timeout", f"{timeout:g}s"]
    with open(out, "wb") as o, open(err, "wb") as e:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=o, stderr=e, env=child_env(url, folder), cwd=folder)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"up exited {proc.returncode}: {err.read_text(errors='replace')[-1500:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}


def record_span(url: str, names: list[str]) -> dict:
    """From the run records: first start to last finish, and the outcomes."""
    from reconciler.api.meta import to_epoch
    from reconciler.reads import job_statuses
    from reconciler.store import Store

    store = Store(url)
    try:
        statuses = job_statuses(store, names)
    finally:
        store.dispose()
    runs = [s["runs"][-1] for s in statuses.values() if s.get("runs")]
    outcomes: dict[str, int] = {}
    for s in statuses.values():
        outcomes[str(s.get("outcome"))] = outcomes.get(str(s.get("outcome")), 0) + 1
    if outcomes != {"Succeeded": len(names)}:
        raise RuntimeError(f"outcomes {outcomes}")
    first = min(to_epoch(r["startedAt"]) for r in runs)
    last = max(to_epoch(r["finishedAt"]) for r in runs)
    return {"span": last - first}


def wrapper_floor(jobs: int, slots: int, folder: Path) -> float:
    """Wall time of `jobs` runs of /bin/true through the crash-safe run wrapper alone
    (spawn_run: run dir, log files, the wrapper the agent uses, the C one where it builds, and
    its exit record), N in flight, no store and no decisions: what the process model costs
    before any reconciling."""
    from reconciler.agent.cwrapper import build
    from reconciler.agent.process import read_exit, reap, spawn_run

    binary = build(folder / "floor-state")
    start, running, started, env = time.perf_counter(), [], 0, {}
    while started < jobs or running:
        while started < jobs and len(running) < slots:
            run_dir = folder / "floor" / str(started)
            running.append(
                (
                    spawn_run(
                        argv=["/bin/true"], env=env, cwd=str(folder), run_dir=run_dir, fsync_exit=False, wrapper=binary
                    ),
                    run_dir,
                )
            )
            started += 1
        os.wait()  # any child: one slot frees
        for identity, run_dir in list(running):
            if reap(identity) is not None and read_exit(run_dir) is not None:
                running.remove((identity, run_dir))
    return time.perf_counter() - start


def spawn_floor(jobs: int, slots: int) -> float:
    """Wall time of `jobs` bare os.posix_spawn calls of /bin/true from this interpreter, N in
    flight: no wrapper, no run dir, no store. What any runner written in Python pays to start
    and reap the processes; the same order as make's own cost."""
    start, running, started = time.perf_counter(), 0, 0
    while started < jobs or running:
        while started < jobs and running < slots:
            os.posix_spawn("/bin/true", ["/bin/true"], os.environ)
            started, running = started + 1, running + 1
        os.wait()
        running -= 1
    return time.perf_counter() - start


def store_writes(url: str) -> int:
    """Write transactions that changed something, since the store was created."""
    from reconciler.store import Store

    store = Store(url)
    try:
        return store.change_seq()
    finally:
        store.dispose()


def measure(jobs: int, width: int, slots: int, store_kind: str, make_repeat: int = 3) -> dict:
    byte_compile()  # the commands measured import compiled code, as after `pip install`
    with scratch(store_kind) as (url, folder):
        text = manifests(jobs, width, slots)
        if slots > (os.cpu_count() or 1):
            text += node_manifest(slots)
        (folder / "dag.yaml").write_text(text)
        (folder / "Makefile").write_text(makefile(jobs, width))
        (folder / "dodo.py").write_text(dodo(jobs, width))
        make_walls = run_make(folder, slots, repeat=make_repeat)
        doit_wall = run_doit(folder, slots)
        floor = wrapper_floor(jobs, slots, folder)
        bare = spawn_floor(jobs, slots)
        log(f"dag {store_kind}: make -j{slots} {median(make_walls):.3f} s; running up on {jobs} jobs")
        up = run_up(url, folder, folder / "dag.yaml", timeout=max(120.0, jobs * 0.5), label="up")
        span = record_span(url, [n for names in layers_of(jobs, width) for n in names])
        writes = store_writes(url)
    # the fixed cost of the verb: interpreter, imports, store, apply, controller start and stop
    with scratch(store_kind) as (url, folder):
        (folder / "one.yaml").write_text(manifests(1, 1, slots))
        fixed = run_up(url, folder, folder / "one.yaml", timeout=60, label="one")
    return {
        "make": median(make_walls),
        "make_all": make_walls,
        "doit": doit_wall,
        "up": up["wall"],
        "up_cpu": up["cpu"],
        "span": span["span"],
        "fixed": fixed["wall"],
        "floor": floor,
        "bare": bare,
        "writes": writes,
    }


def row(figure: str, jobs: int, width: int, slots: int, store_kind: str) -> Row:
    if not make_available():
        raise RuntimeError("make is not installed")
    m = measure(jobs, width, slots, store_kind)
    ratio = m["up"] / m["make"]
    per_job_ms = (m["span"] / jobs) * 1000
    notes = [
        f"{figure}: {jobs} jobs, width {width}, {jobs // width} layers, N={slots}. up wall {m['up']:.2f} s "
        f"(CPU {m['up_cpu']:.2f} s incl. runs) = fixed cost of `up` on 1 job {m['fixed']:.2f} s + the rest; "
        f"first run start -> last run finish {m['span']:.2f} s ({per_job_ms:.2f} ms/job, "
        f"{jobs / m['span']:.0f} jobs/s); make runs: {', '.join(f'{w:.3f}' for w in m['make_all'])} s; "
        f"ratio without the fixed cost {(m['up'] - m['fixed']) / m['make']:.2f}x; the run wrapper alone "
        f"(spawn_run, N in flight, no store) {m['floor']:.2f} s = {m['floor'] / m['make']:.2f}x make; "
        f"bare os.posix_spawn of /bin/true from Python (no wrapper, no store) {m['bare']:.2f} s = "
        f"{m['bare'] / m['make']:.2f}x make, so before it stores anything `up` cannot do better than "
        f"(fixed + bare) / make = {(m['fixed'] + m['bare']) / m['make']:.2f}x; "
        f"store write transactions {m['writes']} ({m['writes'] / jobs:.1f} per job)",
    ]
    if m["doit"] is not None:
        notes.append(
            f"{figure}: doit -n {slots} -P thread on the same graph {m['doit']:.2f} s = {m['doit'] / m['make']:.2f}x "
            f"make; up / doit = {m['up'] / m['doit']:.2f}x (issue 15's aim: SQLite <= 1x, PostgreSQL <= 1.5x)"
        )
    return Row(figure, f"up {m['up']:.2f} s", f"make -j{slots} {m['make']:.2f} s", ratio, "x", AIM, notes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--width", type=int, default=50)
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 2, help="N: global pool and make -j")
    parser.add_argument("--store", choices=("sqlite", "pg"), default="sqlite")
    args = parser.parse_args(argv)
    figure = "1 DAG throughput" if args.store == "sqlite" else "7 DAG throughput"
    print_table([row(f"{figure} ({args.store})", args.jobs, args.width, args.slots, args.store)])


if __name__ == "__main__":
    main()
