"""Figure 6: controller memory. A store holding N jobs, of which A are active (waiting for a
file that never appears) and N - A Completed with a real run record. The Completed ones are
written in bulk through the repository (`create_many`), their spec and status copied from a
job that this benchmark really ran to completion on the same store. Then the real verb,
`reconciler controller`, starts as a subprocess; once every active job has been looked at
and the process has settled, its peak RSS (VmHWM) is read. Beside it: the peak RSS of a
controller on an empty store.

    .venv/bin/python bench/memory.py                    # 100,000 jobs, 1,000 active
    .venv/bin/python bench/memory.py --jobs 2000 --active 20 --settle 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Controller,
    Row,
    RssSampler,
    log,
    print_table,
    scratch,
    state_home,
    vm_hwm_kb,
    wait_for,
)
from bench.idle import apply_text, waiting_count, waiting_jobs_yaml

AIM_MB = 250.0
BATCH = 5000


def completed_template(url: str, folder: Path) -> tuple[dict, dict, dict, dict]:
    """Run one real job to completion; return its (spec, status, labels, annotations)."""
    from reconciler.controller.manager import Controller as InProcess
    from reconciler.reads import job_statuses
    from reconciler.store import Store
    from reconciler.store import repository as repo

    apply_text(
        url,
        "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: done-template, labels: "
        "{pipeline: bench}}\nspec:\n  command: [/bin/true]\n",
        folder,
    )
    store = Store(url)
    try:
        with state_home(folder):
            controller = InProcess(store).start()
            try:
                wait_for(
                    lambda: job_statuses(store, ["done-template"])["done-template"].get("phase") == "Completed",
                    60,
                    0.05,
                    "the template job completed",
                )
            finally:
                controller.stop()
        with store.read() as session:
            obj = repo.get(session, kind="Job", name="done-template")
        return obj.spec, obj.status, obj.labels, obj.annotations
    finally:
        store.dispose()


def populate(url: str, folder: Path, total: int, active: int) -> None:
    from reconciler.store import Store
    from reconciler.store import repository as repo

    spec, status, labels, annotations = completed_template(url, folder)
    if status.get("outcome") != "Succeeded":
        raise RuntimeError(f"template job ended {status.get('outcome')}")
    store = Store(url)
    try:
        done = total - active - 1  # the template is one of them
        for start in range(0, done, BATCH):
            with store.write() as tx:
                repo.create_many(
                    tx,
                    [
                        dict(
                            kind="Job",
                            name=f"done-{i:06d}",
                            spec=spec,
                            labels=labels,
                            annotations=annotations,
                            status=status,
                        )
                        for i in range(start, min(done, start + BATCH))
                    ],
                )
    finally:
        store.dispose()
    apply_text(url, waiting_jobs_yaml(active, prefix="active", interval="1s"), folder)


def peak(url: str, folder: Path, active: int, settle: float, label: str) -> dict:
    from reconciler.store import Store

    store = Store(url)
    try:
        with Controller(url, folder, name=label) as controller:
            sampler = RssSampler(controller.pid)
            t0 = time.monotonic()
            controller.wait_started()
            try:
                wait_for(
                    lambda: controller.check() or waiting_count(store) >= active,
                    max(120.0, active * 0.2),
                    0.2,
                    f"{active} active jobs evaluated",
                )
                ready = time.monotonic() - t0
                time.sleep(settle)
                controller.check()
                hwm = vm_hwm_kb(controller.pid)
            finally:
                sampler.stop()
            return {
                "hwm_mb": (hwm * 1024 if hwm else sampler.peak) / 2**20,
                "sampled_mb": sampler.peak / 2**20,
                "now_mb": sampler.last / 2**20,
                "ready": ready,
            }
    finally:
        store.dispose()


def figures(total: int, active: int, settle: float, store_kind: str = "sqlite") -> dict:
    with scratch(store_kind) as (url, folder):
        log("memory: reference, a controller on an empty store")
        empty = peak(url, folder, 0, settle, "empty")
    with scratch(store_kind) as (url, folder):
        t0 = time.perf_counter()
        populate(url, folder, total, active)
        log(
            f"memory: {total} jobs stored ({active} active) in {time.perf_counter() - t0:.1f} s; "
            "starting the controller"
        )
        loaded = peak(url, folder, active, settle, "loaded")
    return {"empty": empty, "loaded": loaded}


def row(total: int, active: int, settle: float, store_kind: str = "sqlite") -> Row:
    f = figures(total, active, settle, store_kind)
    e, lo = f["empty"], f["loaded"]
    label = f"6 memory ({store_kind})"
    notes = [
        f"{label}: {total:,} stored jobs, {active:,} active (waiting on a path); peak RSS (VmHWM) "
        f"{lo['hwm_mb']:.0f} MB, RSS after settling {lo['now_mb']:.0f} MB; all active jobs looked at "
        f"{lo['ready']:.1f} s after start; empty-store controller: peak {e['hwm_mb']:.0f} MB"
    ]
    return Row(
        label,
        f"peak RSS {lo['hwm_mb']:.0f} MB, {total:,} jobs",
        f"{e['hwm_mb']:.0f} MB with no jobs",
        lo["hwm_mb"],
        "MB",
        AIM_MB,
        notes,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--active", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--store", choices=("sqlite", "pg"), default="sqlite")
    args = parser.parse_args(argv)
    print_table([row(args.jobs, args.active, args.settle, args.store)])


if __name__ == "__main__":
    main()
