"""The local node: registered on first start (named after the host), kept Ready by heartbeats."""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from ..agent.local import owner_gone
from ..api import node as node_api
from ..api.annotations import HOSTNAME_LABEL
from ..api.meta import from_epoch, to_epoch
from ..api.node import heartbeat_fresh, heartbeat_status
from ..store import Store, eventlog
from ..store import repository as repo
from ..store import scheduling as sched
from .owners import process_of

HEARTBEAT_INTERVAL = 10.0  # seconds between the local node's heartbeats, at most (heartbeat_interval)


def heartbeat_interval() -> float:
    """A quarter of the window after which a silent node is NotReady, at most
    HEARTBEAT_INTERVAL: a controller judging nodes NotReady after 3 s (`serve
    --node-lost-after 3s`) beats often enough to keep its own node Ready."""
    return min(HEARTBEAT_INTERVAL, node_api.READY_WINDOW / 4)


def local_node_name() -> str:
    """The host name as a DNS-1123 label."""
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().split(".")[0].lower()).strip("-")[:63].strip("-")
    return name or "localhost"


DEFAULT_ADDRESS = "127.0.0.1"  # a node that names no address: reachable from this machine


def note_not_ready(store: Store, now: float, since: float = 0.0) -> list[str]:
    """Record, once, that a node's heartbeats stopped: the Ready condition is derived when the
    node is read (api/node.observed_status), so nothing else writes the moment; an event
    NodeNotReady does, as Kubernetes' node controller records it (NodeReady comes with the
    next heartbeat, which also drops the mark). The nodes it marked. `since`: when this
    controller started; silence before it, while no controller was up to hear the node, is
    not counted (a server restarted after a minute down would call every node NotReady)."""

    def silent(status: dict[str, Any] | None) -> bool:
        beat = (status or {}).get("heartbeatAt")
        return bool(beat) and now - max(to_epoch(beat), since) >= node_api.READY_WINDOW

    with store.read() as session:
        stale = [
            o.name
            for o in repo.list_objects(session, kind="Node")
            if silent(o.status) and not (o.status or {}).get("notReadySince")
        ]
    if not stale:
        return []
    marked = []
    with store.write(epoch_safe=True) as tx:  # nodes only
        for obj in repo.list_objects(tx.session, kind="Node", names=stale):
            status = dict(obj.status or {})
            if not silent(status) or status.get("notReadySince"):
                continue  # a heartbeat came meanwhile, or another controller said it
            window = node_api.READY_WINDOW  # read now: serve --node-lost-after sets it
            marked_at = from_epoch(max(to_epoch(status["heartbeatAt"]), since) + window)
            updated = repo.update_object(tx, obj, status={**status, "notReadySince": marked_at})
            said = f"node {obj.name} posted no heartbeat for {window:g}s (its last at {status['heartbeatAt']})"
            eventlog.record(tx, eventlog.ObjectEvent(updated, "NodeNotReady", said, True))
            marked.append(obj.name)
    return marked


def heartbeat(
    store: Store,
    node: str,
    owner: str,
    now: float,
    *,
    paths_swept_at: float | None = None,
    address: str = DEFAULT_ADDRESS,
    state_dir: str | None = None,
) -> bool:
    """Register the node if it is new, then record it Ready with its allocation. True when
    the node just became Ready (new, or its last heartbeat had gone stale): jobs queued as
    Unschedulable may fit now."""
    with store.write(known=True, epoch_safe=True) as tx:  # the controller wakes whom a return of its node concerns
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
            eventlog.record(tx, eventlog.ObjectEvent(obj, "Registered", f"node {node} registered by its agent"))
        mine = next((f for f in sched.node_facts(tx.session, now) if f.name == node), None)
        allocated = mine.allocated_status() if mine else {"slots": 0}
        previous = obj.status or {}
        became_ready = not heartbeat_fresh(previous, now)
        status = heartbeat_status(
            previous, now, allocated=allocated, cpu_count=os.cpu_count() or 1, agent=owner, address=address
        )
        if paths_swept_at is not None:  # readers show it as the last check of paths still watched
            status["pathsCheckedAt"] = from_epoch(paths_swept_at)
        if state_dir is not None:  # where its runs' folders are: a server beside it must share it
            status["stateDir"] = state_dir
        obj = repo.update_object(tx, obj, status=status)
        if became_ready and previous:  # back after a silence (a restart of the controller, often)
            eventlog.record(tx, eventlog.ObjectEvent(obj, "NodeReady", f"node {node} posts heartbeats again"))
    return became_ready


def shared_node_refusal(store: Store, node: str, *, local_node: bool, state_dir: str, now: float) -> str | None:
    """Why a server may not run on this machine beside another live server of the store
    (None when it may). Servers on one machine share its node, and a new leader adopts the
    runs its predecessor left there from the state folder they share: a server with another
    folder would find none of them (they would end Lost and run again), and one without the
    local node could not act on them at all while it leads (they would stay Running)."""
    with store.read() as session:
        obj = repo.get(session, kind="Node", name=node)
    status = (obj.status or {}) if obj is not None else {}
    owner = str(status.get("agent") or "")
    gone = owner_gone(process_of(owner))  # a controller's owner names its term after the process
    if obj is None or status.get("remote") or not heartbeat_fresh(status, now) or not owner or gone:
        return None
    if not local_node:
        return (
            f"node {node}, this machine, is served by another server of this store ({owner}): a server here "
            "without the local node could lead without being able to act on this machine's runs; give every "
            "server on one machine the local node (no --no-local-node), or none"
        )
    theirs = status.get("stateDir")
    if theirs and theirs != state_dir:
        return (
            f"node {node}, this machine, is served by another server of this store ({owner}) whose state folder "
            f"is {theirs}, not {state_dir}: a leader adopts the runs of the one before from the folder they share, "
            "so servers on one machine must share it (the same XDG_STATE_HOME)"
        )
    return None
