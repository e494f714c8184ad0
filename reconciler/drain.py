"""verb: `drain`'s wait. Once `commands.drain` has cordoned the nodes (in one transaction,
with `--force` declaring their runs lost), this follows the change feed until no admission
holds slots on them: every admission's release is written with its job's status, so a
change of a job is when to look again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .store import Store
from .store import repository as repo
from .store import scheduling as sched
from .store.feed import ChangeFeed

LOOK_INTERVAL = 0.05  # seconds between looks at the cheap change sequence when nothing announces a write


@dataclass(frozen=True)
class HeldRun:
    """An admission holding slots on a node being drained: what `drain` waits for."""

    node: str
    job: str
    run: int
    phase: str  # the job's phase, for the user to see what it waits for


def runs_on(store: Store, nodes: list[str]) -> list[HeldRun]:
    """The admissions holding slots on `nodes`, in one snapshot."""
    with store.read() as session:
        held = [(node, a) for node in nodes for a in sched.admissions_on(session, node)]
        found = repo.statuses(session, kind="Job", names={a.name for _, a in held})
    return [
        HeldRun(node, a.name, a.run_number, str(o.status.get("phase")) if (o := found.get(a.name)) else "Deleted")
        for node, a in held
    ]


def wait_drained(
    store: Store,
    nodes: list[str],
    timeout: float | None,
    on_change: Callable[[list[HeldRun]], None] = lambda _: None,
) -> list[HeldRun]:
    """Follow the change feed until no admission holds slots on `nodes` (every admission's
    release is written with its job's status, so a change of the job is when to look), or
    `timeout` passes; returns what still holds slots then ([] when drained). `on_change`
    gets what it waits for, at first and whenever that changes."""
    feed = ChangeFeed(store, listen=True)  # before the first look: no release falls in between
    deadline = None if timeout is None else time.monotonic() + timeout
    held = runs_on(store, nodes)
    on_change(held)
    while held:
        at = time.monotonic()
        if deadline is not None and at >= deadline:
            return held
        # until a write is announced (PostgreSQL's notifications), else the poll's interval
        feed.wait(LOOK_INTERVAL if deadline is None else min(LOOK_INTERVAL, deadline - at))
        if feed.poll() and (now := runs_on(store, nodes)) != held:
            held = now
            on_change(held)
    return held
