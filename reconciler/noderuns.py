"""verb: what a remote node agent (`reconciler agent`) tells the store and asks of it: its
heartbeat (which registers its Node), the runs placed on its node, its reports of their
start and end, each fenced by the epoch of the admission it names (API.md section 2), and
which of its ended runs the store still keeps (their folders may go)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api import node as node_api
from .api.annotations import HOSTNAME_LABEL
from .api.meta import ObjectMeta, from_epoch
from .api.node import Capacity, heartbeat_fresh, heartbeat_status
from .errors import Conflict, InvalidInput, Unavailable
from .store import Store, eventlog, placements
from .store import repository as repo
from .store import scheduling as sched
from .store.dbapi import Connection
from .store.transactions import Tx

Report = placements.Report  # an agent's report of one run, named by its admission
# the controller in this process, taking a write into its batch: hand(write, jobs to step
# after it) gives write(tx)'s result once committed, or None when it did not take it
Hand = Callable[[Callable[[Tx], Any], list[str]], Any]

MANAGED_BY = "reconciler.dev/managed-by"
REMOTE_AGENT = "remote-agent"  # a Node an agent registered: its labels and capacity follow the agent's flags


@dataclass(frozen=True)
class Beat:
    agent: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, Any] = field(default_factory=dict)
    cpu_count: int = 1
    log_port: int | None = None
    withdraws: bool = False  # it answers a stop of a run it has not started (an older agent does not)


def heartbeat(store: Store, node: str, beat: Beat, now: float, up_since: float = 0.0) -> tuple[bool, str]:
    """Register the node if it is new (as its agent describes it), then record it Ready:
    whether it just became Ready, and the Node's uid (its registration in this store). A node
    another live agent serves is refused (409): two agents must not run one node's admissions.
    `up_since`: when this server began taking heartbeats; silence before it is not held
    against the serving agent (503 until then)."""
    try:
        ObjectMeta(name=node, labels=beat.labels)
        capacity = Capacity.model_validate(beat.capacity).model_dump(by_alias=True, exclude_none=True)
    except ValueError as exc:
        raise InvalidInput(f"heartbeat of node {node}: {exc}") from None
    labels = {**beat.labels, HOSTNAME_LABEL: beat.agent.partition(":")[0][:63]}
    # not `known`: the controller's change feed wakes the jobs that wait for a node
    with store.write(epoch_safe=True) as tx:
        obj = repo.get(tx.session, kind="Node", name=node)
        if obj is None:
            obj = repo.create(
                tx,
                kind="Node",
                name=node,
                spec={"capacity": capacity, "unschedulable": False},
                labels=labels,
                annotations={MANAGED_BY: REMOTE_AGENT},
            )
            eventlog.record(tx, eventlog.ObjectEvent(obj, "Registered", f"node {node} registered by its agent"))
        previous = obj.status or {}
        serving = previous.get("agent")
        other_host = str(serving).partition(":")[0] != beat.agent.partition(":")[0]
        if serving not in (None, beat.agent) and heartbeat_fresh(previous, now):
            if not previous.get("remote"):
                raise Conflict(f"node {node} is served by the controller {serving}; give this agent another --node")
            if other_host:
                # an agent on another machine posts heartbeats for it: two machines must not
                # run one node's admissions (the same host's is a restarted agent taking over)
                raise Conflict(f"node {node} is served by the agent {serving}; give this agent another --node")
        elif serving not in (None, beat.agent) and (other_host or not previous.get("remote")):
            # stale, but maybe only while this server was down: its agent may be alive, and
            # gets the window from the server's start to be heard again before another takes over
            window = node_api.READY_WINDOW
            if now - up_since < window:
                raise Unavailable(
                    f"node {node} was served by {serving}, silent only while this server was down: "
                    f"another agent may take it over at {from_epoch(up_since + window)} if it stays silent"
                )
        if obj.annotations.get(MANAGED_BY) == REMOTE_AGENT:
            spec = {**obj.spec, "capacity": capacity}
            if spec != obj.spec or labels != obj.labels:
                obj = repo.update_object(tx, obj, spec=spec, labels=labels)
        mine = next((f for f in sched.node_facts(tx.session, now) if f.name == node), None)
        allocated = mine.allocated_status() if mine else {"slots": 0}
        became_ready = not heartbeat_fresh(previous, now)
        status = heartbeat_status(
            previous, now, allocated=allocated, cpu_count=beat.cpu_count, agent=beat.agent, address=beat.address
        )
        status["remote"] = True
        if beat.withdraws:  # the controller waits for its word on a stopped Starting run
            status["withdraws"] = True
        if beat.log_port is not None:
            status["logPort"] = beat.log_port
        repo.update_object(tx, obj, status=status)
        if became_ready and previous:
            eventlog.record(tx, eventlog.ObjectEvent(obj, "NodeReady", f"node {node} posts heartbeats again"))
    return became_ready, obj.uid


def kept_runs(store: Store, node: str, runs: list[tuple[str, int, str]]) -> list[bool]:
    """For each ended run (job uid, run number, the node's uid it was placed under) whose
    folder an agent holds, whether the store still keeps it (store/placements.kept_runs): the
    agent removes the folders of the others."""
    with store.read() as session:
        return placements.kept_runs(session, node, runs)


def serving(store: Store, node: str, agent: str | None) -> None:
    """Conflict (409) when `agent` (as its request names it) is not the one whose heartbeat
    the node last accepted: a duplicate on another host, refused at its heartbeat, or one
    another took the node over from, must learn of no run and report on none; nor any agent
    of a node a controller serves itself, whether or not the request names one."""
    with store.read() as session:
        serving_in(session, node, agent)


def serving_in(session: Connection, node: str, agent: str | None, read: dict[str, Any] | None = None) -> None:
    """`serving`, judged in the caller's transaction (the one that reads or writes for the
    agent: no transaction of its own). A node a controller serves itself (a server's own
    node) is no agent's, whether or not the request names one: its runs are that
    controller's to start, and a report on them would be kept and never read. `read`: the
    Nodes the transaction read, as they stand in it (`Tx.nodes`), used and added to."""
    if read is not None and node in read:
        obj = read[node]
    else:
        obj = repo.get(session, kind="Node", name=node)
        if read is not None:
            read[node] = obj
    status = (obj.status or {}) if obj is not None else {}
    current = status.get("agent")
    if current is not None and not status.get("remote"):
        raise Conflict(
            f"node {node} is served by the controller {current}, not by an agent; give this agent another --node"
        )
    if agent and current is not None and current != agent:
        raise Conflict(f"node {node} is served by the agent {current}, not {agent}; give this agent another --node")


def placed(store: Store, node: str, agent: str | None = None) -> list[dict[str, Any]]:
    """The admissions on `node`, as its agent acts on them: start the run unless the server
    holds a report of it (`started`, `finished`), or stop it (`stop`: the job is Stopping
    that run), each with its epoch and the job's spec. Only what the agent acts on is in
    an item, so its long poll is answered when that changes, not on every status write.
    Conflict when `agent` does not serve the node (`serving`, in the same read)."""
    with store.read() as session:
        serving_in(session, node, agent)
        rows = placements.placed_on(session, node)
    items = []
    for row in rows:
        reported = row.report or {}
        status = json.loads(row.status or "{}")
        item: dict[str, Any] = {
            "job": row.name,
            "uid": row.uid,
            "run": row.run_number,
            "epoch": row.epoch,
            "spec": json.loads(row.spec),
            "started": bool(reported.get("startedAt") or reported.get("startFailed")),
            "finished": bool(reported.get("finishedAt")),
            "revision": status.get("revision", 1),
        }
        if row.phase == "Stopping":
            runs, stop = status.get("runs") or [], status.get("stop") or {}
            open_run = runs and not runs[-1].get("finishedAt") and runs[-1]["number"] == row.run_number
            if open_run or stop.get("unstarted") == row.run_number:  # the latter: never to start
                item["stop"] = {"reason": stop.get("reason"), "message": stop.get("message")}
        items.append(item)
    return items


def placement_keys(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Per node, a key that changes whenever what its agent acts on in `placed(store, node)`
    may have changed (not whether a start or end is reported); one query for every node."""
    with store.read() as session:
        return placements.placement_keys(session)


def report_many(
    store: Store, node: str, reports: list[Report], agent: str | None = None, *, hand: Hand | None = None
) -> tuple[list[bool], bool]:
    """Keep several reports of the node's agent in one transaction; per report, whether it
    was kept (False: its admission is no longer current, as `report` refuses it with 409).
    A stale report refuses only itself, not the others. Conflict, and nothing kept, when
    `agent` does not serve the node (`serving`, judged in the same transaction).
    `hand`: the controller in this process, which makes the write in its own batch when it
    takes it (and steps the reported jobs after it); the second value says it did. Else
    the write is a transaction of its own, and the caller wakes the jobs."""

    def write(tx: Tx) -> list[bool]:
        serving_in(tx.session, node, agent, tx.nodes)
        return placements.record_reports(tx, node, reports)

    if not reports:
        serving(store, node, agent)
        return [], False
    if hand is not None and (kept := hand(write, [r.job for r in reports if r.job])) is not None:
        return kept, True
    with store.write(epoch_safe=True) as tx:
        return write(tx), False


def report(
    store: Store,
    node: str,
    job: str,
    *,
    uid: str,
    run: int,
    epoch: int,
    facts: dict[str, Any],
    agent: str | None = None,
) -> None:
    """Keep the agent's report on the admission it names; Conflict (409) when that admission
    is no longer current: the run was declared lost, retried elsewhere, or stopped, or when
    `agent` does not serve the node (`serving`, judged in the same transaction)."""
    with store.write(epoch_safe=True) as tx:
        serving_in(tx.session, node, agent)
        if not placements.record_report(tx, uid=uid, node=node, run=run, epoch=epoch, report=facts):
            raise Conflict(stale_message(job, node, run, epoch))


def stale_message(job: str, node: str, run: int, epoch: int) -> str:
    return (
        f"run {run} of job {job} on node {node} (epoch {epoch}) is no longer current: "
        "its admission was released or replaced; stop the process"
    )
