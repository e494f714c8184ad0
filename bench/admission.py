"""Figure 3 (and 7 on PostgreSQL): the cost of one admission decision at queue depth.

Pool `p` has 2 slots, held by two long-running jobs (`sleep`, started by a real controller).
D single-slot jobs are applied to `p`, and each gets the reconcile a controller worker gives a
new job (the same `JobReconciler`, driven here one job at a time), which leaves it Queued. With
the queue at depth D, the benchmark times the reconcile of one queued job, exactly as a controller worker
runs it when the job is woken: `JobReconciler.__call__(name)`, i.e. read the job,
then `queued()`: one write transaction that re-enqueues idempotently, reads the queue entry,
node facts, pool facts and the head of line, decides (no room: InsufficientSlots) and writes
nothing. Two situations (VARIANTS): "no room" as above, and "head blocks" (one free slot,
a head of line that needs two, maxBypass 0), where every decision runs the whole admission
transaction. It is timed for the newest job in line (the tail) and for the head. Depths D1 and
D2 each get their own fresh store, filled the same way; both stay live and their timings are
interleaved in rounds, so load from elsewhere weighs on both alike. Figure: tail cost at D2 /
tail cost at D1 (medians).

    .venv/bin/python bench/admission.py                      # depths 100 and 10,000, SQLite
    .venv/bin/python bench/admission.py --depths 10 200 --store pg
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Row,
    kill_run_groups,
    log,
    median,
    percentile,
    print_table,
    scratch,
    sql_scalar,
    state_home,
    wait_for,
)

AIM = 1.5
SAFETY_POLL = 30.0  # reconciler.controller.job.SAFETY_POLL, read at run time when it exists
# Two situations, both decided by the code a controller worker runs for a woken queued job:
# - "no room": pool p (2 slots) is full, held by two running jobs; every job needs 1 slot.
# - "head blocks": pool p has 1 free slot (one holder) and maxBypass 0; the head of line needs
#   2 slots, so it cannot start, and nobody may pass it. A younger job's decision then goes
#   through the whole admission transaction (queue entry, node facts, pool facts, the head of
#   line and whether it fits now) and ends "wait".
VARIANTS = {
    "no room": {"pool": "{slots: 2}", "holders": ["hold-0", "hold-1"], "head_slots": 1},
    "head blocks": {"pool": "{slots: 2, maxBypass: 0}", "holders": ["hold-0"], "head_slots": 2},
}


def _docs(names: list[str], command: str, slots: int = 1, priority: int = 0) -> str:
    return "---\n".join(
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: {n}}}\n"
        f"spec:\n  command: {command}\n  pool: p\n  slots: {slots}\n  priority: {priority}\n"
        for n in names
    )


def _apply(store, text: str, folder: Path) -> None:
    from reconciler.apply import apply_manifests
    from reconciler.manifests import parse_text

    manifests, problems = parse_text(text, "bench.yaml", folder)
    if problems:
        raise RuntimeError(problems[:3])
    apply_manifests(store, manifests)


def _run_controller_until(store, predicate, timeout: float, what: str) -> None:
    from reconciler.controller.manager import Controller

    controller = Controller(store).start()
    try:
        wait_for(predicate, timeout, 0.1, what)
    finally:
        controller.stop()


def queue_depth(store) -> int:
    return int(sql_scalar(store, "SELECT count(*) FROM queue"))


def line(store) -> tuple[str, str]:
    """(head, tail) names of pool p's queue in admission order."""
    from reconciler.store import queuing

    with store.read() as session:
        head = queuing.first_in_line(session, "p", 1)[0]
    tail = sql_scalar(
        store, "SELECT job_name FROM queue WHERE pool = 'p' ORDER BY rank DESC, eligible_at DESC, job_uid DESC LIMIT 1"
    )
    return head, tail


def fill(store, wired, folder: Path, depth: int, store_kind: str, variant: str) -> float:
    """Holders running in pool p (a real controller starts them), then `depth` jobs queued
    behind them: each new job gets the reconcile a controller worker gives a new job (Waiting
    -> eligible -> admission attempt -> Queued), driven here one job at a time (a running
    controller would also re-check every queued job every 30 s; see the notes). Returns the
    mean cost of that first reconcile, in us."""
    from reconciler.controller.nodes import heartbeat
    from reconciler.reads import job_statuses

    v = VARIANTS[variant]
    _apply(
        store,
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {{name: p}}\nspec: {v['pool']}\n"
        "---\n" + _docs(v["holders"], "[sleep, '3600']"),
        folder,
    )
    _run_controller_until(
        store,
        lambda: all(s.get("phase") == "Running" for s in job_statuses(store, v["holders"]).values()),
        60,
        "the holders running",
    )
    names = [f"q-{i:06d}" for i in range(depth)]
    t0 = time.perf_counter()
    # the head of line by priority: eligibleAt has millisecond resolution, and two jobs made
    # eligible within one millisecond are ordered by uid, which is random
    _apply(
        store,
        _docs(names[:1], "[/bin/true]", v["head_slots"], priority=1) + "---\n" + _docs(names[1:], "[/bin/true]"),
        folder,
    )
    t1 = time.perf_counter()
    for i, name in enumerate(names):
        if i % 2000 == 0:
            heartbeat(store, wired.node, wired.owner, wired.clock.now())  # keep the node Ready meanwhile
        wired.jobs(name)
    t2 = time.perf_counter()
    if queue_depth(store) != depth:
        raise RuntimeError(f"{queue_depth(store)} jobs queued, {depth} expected")
    log(
        f"admission {store_kind} ({variant}): depth {depth} filled (apply {t1 - t0:.1f} s, "
        f"first reconciles {t2 - t1:.1f} s)"
    )
    return (t2 - t1) / depth * 1e6


def measure(
    depths: list[int], store_kind: str, reps: int, variant: str = "no room", rounds: int = 6
) -> dict[int, dict]:
    """Both depths live at once, each in its own fresh store; their timings are interleaved in
    rounds so that a noisy neighbour weighs on both alike."""
    from reconciler.controller.manager import Controller
    from reconciler.controller.nodes import heartbeat
    from reconciler.store import Store

    with ExitStack() as stack:
        setups = {}
        for depth in depths:
            url, folder = stack.enter_context(scratch(store_kind))
            if not setups:
                stack.enter_context(state_home(folder))  # run dirs of a PostgreSQL store
            store = Store(url)
            stack.callback(store.dispose)
            stack.callback(kill_run_groups, store, VARIANTS[variant]["holders"])
            wired = Controller(store)  # the same wiring as the controller process; never started
            stack.callback(wired.agent.close)
            first = fill(store, wired, folder, depth, store_kind, variant)
            head, tail = line(store)
            setups[depth] = (store, wired, {"tail": tail, "head": head}, queue_depth(store), first)
        samples = {(d, w): [] for d in depths for w in ("tail", "head")}
        per_round = max(1, reps // rounds)
        log(f"admission {store_kind} ({variant}): timing {per_round * rounds} decisions per job and depth, interleaved")
        for _ in range(rounds):
            for depth, (store, wired, names, _, _) in setups.items():
                # keep the local node Ready (placement reads its heartbeat), as a running controller does
                heartbeat(store, wired.node, wired.owner, wired.clock.now())
                for which, name in names.items():
                    key = name
                    for _ in range(5):  # warm: spec cache, statement cache, connection pool
                        wired.jobs(key)
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        again = wired.jobs(key)
                        samples[(depth, which)].append((time.perf_counter() - t0) * 1e6)
                    if again.again or again.requeue_after is None:
                        raise RuntimeError(f"{name}: unexpected reconcile result {again}")
        from reconciler.reads import job_statuses

        results = {}
        for depth, (store, _wired, names, actual, first) in setups.items():
            phases = {s.get("phase") for s in job_statuses(store, list(names.values())).values()}
            if phases != {"Queued"}:
                raise RuntimeError(f"measured jobs left the queue: {phases}")
            results[depth] = {
                "depth": actual,
                "first": first,
                **{
                    w: {"p50": median(samples[(depth, w)]), "p90": percentile(samples[(depth, w)], 0.9)}
                    for w in ("tail", "head")
                },
            }
        return results


def _safety_poll() -> float:
    try:
        from reconciler.controller import job

        return float(job.SAFETY_POLL)
    except (ImportError, TypeError, ValueError):
        return SAFETY_POLL


def rows(depths: list[int], store_kind: str, figure: str, reps: int = 300) -> list[Row]:
    """One row per situation; `figure` is e.g. "3 admission at depth (sqlite)"."""
    global SAFETY_POLL
    SAFETY_POLL = _safety_poll()
    lo, hi = sorted(depths)[0], sorted(depths)[-1]
    number, _, kind = figure.partition(" admission at depth ")
    out = []
    for variant in VARIANTS:
        label = f"{number} admission at depth, {variant} {kind}"
        r = measure([lo, hi], store_kind, reps, variant)
        a, b = r[lo]["tail"], r[hi]["tail"]
        notes = [
            f"{label}: one decision = JobReconciler.__call__ of the newest queued job (tail), which stays "
            f"queued; median of {reps}, both depths timed interleaved in one run; "
            + "; ".join(
                f"depth {r[d]['depth']:,}: tail {r[d]['tail']['p50']:.0f} us (p90 "
                f"{r[d]['tail']['p90']:.0f}), head {r[d]['head']['p50']:.0f} us (p90 "
                f"{r[d]['head']['p90']:.0f}), first reconcile of a new job {r[d]['first']:.0f} us"
                for d in (lo, hi)
            )
            + f"; a running controller re-checks every queued job every {SAFETY_POLL:g} s (SAFETY_POLL): at "
            f"depth {hi:,} that is {hi / SAFETY_POLL * b['p50'] / 1e6 * 100:.0f}% of a core at this cost"
        ]
        out.append(
            Row(
                label,
                f"{b['p50'] / 1000:.2f} ms at depth {hi:,}",
                f"{a['p50'] / 1000:.2f} ms at depth {lo:,}",
                b["p50"] / a["p50"],
                "x",
                AIM,
                notes,
            )
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs=2, default=[100, 10_000])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--store", choices=("sqlite", "pg"), default="sqlite")
    args = parser.parse_args(argv)
    figure = f"{'3' if args.store == 'sqlite' else '7'} admission at depth ({args.store})"
    print_table(rows(args.depths, args.store, figure, args.reps))


if __name__ == "__main__":
    main()
