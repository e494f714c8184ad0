"""Figure 19, what starting a run costs (issue 15 part 2, "a cheaper start"): runs of
`/bin/true` through `spawn_run` under each wrapper, interleaved in rounds in this one process,
from the call to the wrapper reaped with its exit record written:

- `sh`: the `/bin/sh -c SCRIPT` wrapper (wrapper.py), as every run was started before;
- `c`: the same protocol compiled from C (`reconciler-run.c`, built by cwrapper.py), exec'd
  per run;
- `server`: the C wrapper's fork server (forkserver.py), as the agent starts runs where the C
  build exists: a request and a one-line reply on the caller's path, the run a forked copy of
  the server (its CPU: the server's and its copies', over all its runs, once it has ended);
- `direct`: what a per-node run supervisor (one long-lived process spawning the runs, like a
  container shim) must still do per run, in this process: the run dir and its files as
  spawn_run makes them, `/bin/true` spawned straight by `subprocess.Popen` in a new session
  with them as stdout and stderr, waited for, its exit record written; no message to or from
  the supervisor is counted, so its saving can be at most whole(c) - whole(direct) a run;
- `bare`: `/bin/true` alone through `subprocess.Popen`: forking and exec'ing the command.

Per run: `spawn` (the call, on the reconcile loop's path) and `whole` (the call to the
wrapper reaped; `spawn_run` is told not to fsync, as the agent does). The figure is the C
wrapper's whole run against the sh wrapper's. No aim: the issue asks to measure and choose.

    .venv/bin/python bench/start.py --runs 500 --rounds 4
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, discard, log

if TYPE_CHECKING:
    from reconciler.agent.forkserver import ForkServer

FIGURE = "19 run start, C fork server against the exec'd C wrapper"
MODES = ("sh", "c", "server", "direct", "bare")


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's reaped children and theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wrapped(
    work: Path, index: int, binary: Path | None, server: ForkServer | None = None
) -> tuple[float, float, float]:
    from reconciler.agent.process import read_exit, reap, spawn_run

    run_dir = work / f"run-{index}"
    cpu = _children_cpu()
    t0 = time.perf_counter()
    identity = spawn_run(
        argv=["/bin/true"], env={}, cwd=str(work), run_dir=run_dir, fsync_exit=False, wrapper=binary, server=server
    )
    t1 = time.perf_counter()
    if server is None:
        while reap(identity) is None:
            time.sleep(0.0001)
    else:  # the server's copy: its end as the agent learns it, a pidfd (the exit record written first)
        with contextlib.suppress(ProcessLookupError):
            pidfd = os.pidfd_open(identity.pid)
            select.select([pidfd], [], [])
            os.close(pidfd)
    t2 = time.perf_counter()
    cpu = _children_cpu() - cpu
    if read_exit(run_dir) is None:
        raise RuntimeError(f"no exit record in {run_dir}")
    discard(run_dir)
    return t1 - t0, t2 - t0, cpu


def _direct(work: Path, index: int) -> tuple[float, float, float]:
    from reconciler.agent.process import _open_private

    run_dir = work / f"run-{index}"
    cpu = _children_cpu()
    t0 = time.perf_counter()
    os.mkdir(run_dir, 0o700)
    out, err = _open_private(run_dir / "stdout"), _open_private(run_dir / "stderr")
    try:
        popen = subprocess.Popen(
            ["/bin/true"], stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=str(work), start_new_session=True
        )
    finally:
        os.close(out)
        os.close(err)
    t1 = time.perf_counter()
    while (code := popen.poll()) is None:
        time.sleep(0.0001)
    fd = os.open(run_dir / "exit", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, f"{code}\n".encode())
    os.close(fd)
    t2 = time.perf_counter()
    discard(run_dir)
    return t1 - t0, t2 - t0, _children_cpu() - cpu


def _bare(work: Path) -> tuple[float, float, float]:
    cpu = _children_cpu()
    t0 = time.perf_counter()
    popen = subprocess.Popen(
        ["/bin/true"], stdin=subprocess.DEVNULL, cwd=str(work), start_new_session=True, close_fds=True
    )
    t1 = time.perf_counter()
    while popen.poll() is None:
        time.sleep(0.0001)
    return t1 - t0, time.perf_counter() - t0, _children_cpu() - cpu


def measure(runs: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds per run (`spawn`, `whole`) of each mode; rounds rotate the modes' order."""
    from reconciler.agent.cwrapper import build
    from reconciler.agent.forkserver import ForkServer

    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-start-"))
    server: ForkServer | None = None
    try:
        t0 = time.perf_counter()
        binary = build(work / "state")
        built = time.perf_counter() - t0
        if binary is None:
            raise RuntimeError("no C compiler here: the C wrapper could not be built")
        samples: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
        (work / "locks").mkdir()
        server = ForkServer(binary, work / "locks")
        for r in range(rounds):
            for i in range(runs):  # one run of each mode in turn: the machine's drift hits all alike
                shift = (r * runs + i) % len(MODES)
                for mode in MODES[shift:] + MODES[:shift]:
                    if mode == "bare":
                        samples[mode].append(_bare(work))
                    elif mode == "direct":
                        samples[mode].append(_direct(work, i))
                    elif mode == "server":
                        samples[mode].append(_wrapped(work, i, binary, server))
                    else:
                        samples[mode].append(_wrapped(work, i, binary if mode == "c" else None))
        cpu = _children_cpu()
        server.close()  # reaped here: its CPU and its copies' (which it reaped) become ours
        server_cpu = (_children_cpu() - cpu) / len(samples["server"])
    finally:
        if server is not None:
            server.close()
        discard(work)
    result = {
        m: {
            "spawn": statistics.median(s for s, _, _ in xs),
            "whole": statistics.median(w for _, w, _ in xs),
            "cpu": statistics.fmean(c for _, _, c in xs),  # in clock ticks: only the mean means anything
        }
        for m, xs in samples.items()
    }
    result["server"]["cpu"] = server_cpu
    result["c"]["built"] = built
    return result


def row(runs: int, rounds: int) -> Row:
    log(
        f"start: {rounds} rounds of {runs} runs each way (sh wrapper, C wrapper, its fork server, a supervisor's "
        "floor, bare Popen)"
    )
    try:
        m = measure(runs, rounds)
    except RuntimeError as exc:
        return Row(FIGURE, "not measured", "-", None, "x", None, [f"19 start: not measured: {exc}"])
    sh, c, server, direct, bare = m["sh"], m["c"], m["server"], m["direct"], m["bare"]
    load = os.getloadavg()[0]
    note = (
        f"19 start: medians of {rounds} x {runs} runs of /bin/true each way, one of each in turn "
        f"(load average {load:.1f}); "
        f"spawn (on the loop's path) sh {sh['spawn'] * 1000:.2f} ms, C {c['spawn'] * 1000:.2f} ms, C fork server "
        f"{server['spawn'] * 1000:.2f} ms, a supervisor's "
        f"own work {direct['spawn'] * 1000:.2f} ms, bare Popen {bare['spawn'] * 1000:.2f} ms; whole run (call to "
        f"wrapper reaped, exit recorded) sh {sh['whole'] * 1000:.2f} ms, C {c['whole'] * 1000:.2f} ms, C fork "
        f"server {server['whole'] * 1000:.2f} ms (to the copy's end seen by a pidfd), a "
        f"supervisor's own work (files, Popen of the command, wait, record; no messages: its floor) "
        f"{direct['whole'] * 1000:.2f} ms, bare Popen of /bin/true {bare['whole'] * 1000:.2f} ms; "
        f"CPU of the run's processes (mean, rusage of reaped children) sh "
        f"{sh['cpu'] * 1000:.2f} ms, C {c['cpu'] * 1000:.2f} ms, C fork server (its own and its copies') "
        f"{server['cpu'] * 1000:.2f} ms, direct {direct['cpu'] * 1000:.2f} ms, bare "
        f"{bare['cpu'] * 1000:.2f} ms; building the C "
        f"wrapper took "
        f"{c['built']:.2f} s (once per state folder; a copy from the user's cache when one is there)"
    )
    return Row(
        FIGURE,
        f"fork server: whole run {server['whole'] * 1000:.2f} ms, spawn {server['spawn'] * 1000:.2f} ms",
        f"C exec'd: {c['whole'] * 1000:.2f} ms, spawn {c['spawn'] * 1000:.2f} ms",
        server["whole"] / c["whole"],
        "x",
        None,
        [note],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    result = row(args.runs, args.rounds)
    print(f"{result.figure}: {result.reconciler} ({result.reference}); ratio {result.result}")
    for note in result.notes:
        print(note)


if __name__ == "__main__":
    main()
