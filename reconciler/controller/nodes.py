"""The local node: registered on first start (named after the host), kept Ready by heartbeats."""

from __future__ import annotations

import os
import re
import socket

from ..api.annotations import HOSTNAME_LABEL
from ..api.meta import from_epoch
from ..api.node import heartbeat_fresh, heartbeat_status
from ..store import Store
from ..store import repository as repo
from ..store import scheduling as sched

HEARTBEAT_INTERVAL = 10.0


def local_node_name() -> str:
    """The host name as a DNS-1123 label."""
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().split(".")[0].lower()).strip("-")[:63].strip("-")
    return name or "localhost"


DEFAULT_ADDRESS = "127.0.0.1"  # a node that names no address: reachable from this machine


def heartbeat(
    store: Store,
    node: str,
    owner: str,
    now: float,
    *,
    paths_swept_at: float | None = None,
    address: str = DEFAULT_ADDRESS,
) -> bool:
    """Register the node if it is new, then record it Ready with its allocation. True when
    the node just became Ready (new, or its last heartbeat had gone stale): jobs queued as
    Unschedulable may fit now."""
    with store.write(known=True) as tx:  # the controller wakes whom a return of its node concerns
        obj = repo.get(tx.session, kind="Node", name=node)
        if obj is None:
            obj = repo.create(
                tx,
                kind="Node",
                name=node,
                # slots only (their default: the CPU count). cpu and memory are counted where an
                # operator declares them: declared here, a service's default 2 CPUs would take a
                # 2-core host whole and hold back every other job, which slots never did
                spec={"capacity": {}, "unschedulable": False},
                labels={HOSTNAME_LABEL: socket.gethostname()[:63]},
                annotations={"reconciler.dev/managed-by": "agent"},
            )
            repo.record_events(tx, repo.ObjectEvent(obj, "Registered", f"node {node} registered by its agent"))
        mine = next((f for f in sched.node_facts(tx.session, now) if f.name == node), None)
        allocated = mine.allocated_status() if mine else {"slots": 0}
        previous = obj.status or {}
        became_ready = not heartbeat_fresh(previous, now)
        status = heartbeat_status(
            previous, now, allocated=allocated, cpu_count=os.cpu_count() or 1, agent=owner, address=address
        )
        if paths_swept_at is not None:  # readers show it as the last check of paths still watched
            status["pathsCheckedAt"] = from_epoch(paths_swept_at)
        repo.update_object(tx, obj, status=status)
    return became_ready
