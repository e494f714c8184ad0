"""Admissions and node allocation: the facts admission and placement decide on (with the
queue's lines, queuing.py), and the rows that record their decisions. Called inside one
write transaction per decision."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.node import heartbeat_fresh
from ..api.quantity import format_cpu, format_size, parse_cpu, parse_size
from ..jsontext import parse
from . import queuing
from .dbapi import Connection, Result, Statement
from .transactions import COUNT_UP, META, Tx

# Statements built once: on the reconcile loop's path, building a statement per call costs
# more than SQLite's work.
# a pool's spec and its slots in use in one round trip; the global pool counts every admission
_POOL_SPEC = "(SELECT spec FROM objects WHERE kind = 'Pool' AND name = :name) AS spec"
_POOL_FACTS = {
    True: Statement(f"SELECT {_POOL_SPEC}, (SELECT coalesce(sum(slots), 0) FROM admissions) AS used"),
    False: Statement(
        f"SELECT {_POOL_SPEC}, (SELECT coalesce(sum(slots), 0) FROM admissions WHERE pool = :name) AS used"
    ),
}
# every node with the slots, cpu and memory allocated on it, in one round trip
_NODES = Statement(
    "SELECT o.name, o.spec, o.status, o.labels, coalesce(a.allocated, 0) AS allocated,"
    " coalesce(a.cpu, 0) AS cpu, coalesce(a.memory, 0) AS memory FROM objects AS o"
    " LEFT OUTER JOIN (SELECT node, sum(slots) AS allocated, sum(cpu) AS cpu, sum(memory) AS memory"
    " FROM admissions GROUP BY node) AS a ON a.node = o.name WHERE o.kind = 'Node'"
)
_ADMIT = Statement(
    "INSERT INTO admissions (job_uid, job_name, pool, slots, node, run_number, admitted_at, owner, port, cpu, memory,"
    " epoch) VALUES (:job_uid, :job_name, :pool, :slots, :node, :run_number, :admitted_at, :owner, :port, :cpu,"
    " :memory, :epoch)"
)
_PORTS = Statement("SELECT node, port, job_name FROM admissions WHERE port IS NOT NULL")
_ADMISSION = Statement("SELECT node, run_number, owner, epoch, report FROM admissions WHERE job_uid = :uid")
_RELEASE = Statement("DELETE FROM admissions WHERE job_uid = :uid RETURNING pool, slots")
_FREE = Statement("DELETE FROM admissions WHERE job_uid = :uid")
_CLAIM = Statement("UPDATE admissions SET owner = :owner WHERE job_uid = :uid AND owner IS NULL")
_TAKE_OVER = Statement("UPDATE admissions SET owner = :owner WHERE job_uid = :uid AND owner = :previous")
_RESTART_RUN = Statement(
    "UPDATE admissions SET run_number = :run_number, owner = :owner, epoch = :epoch, report = NULL WHERE job_uid = :uid"
)
_ROUND_ROBIN_START = Statement("INSERT INTO meta (key, value) VALUES ('rr', 0)")
_WRITTEN_SINCE = Statement("SELECT kind, name, resource_version, uid FROM objects WHERE resource_version > :rv")
_DELETED_SINCE = Statement(
    "SELECT kind, name, resource_version, uid FROM events WHERE resource_version > :rv AND reason = 'Deleted'"
)
_OPEN_JOBS = Statement("SELECT name FROM objects WHERE kind = 'Job' AND (phase IS NULL OR phase != 'Completed')")
_MAY_NEED_REVISION = Statement(
    "SELECT name FROM objects WHERE kind = 'Job' AND phase = 'Completed' AND (observed_generation IS NULL"
    " OR observed_generation != generation OR annotations LIKE '%\"reconciler.dev/rerun\"%')"
)
_DEPENDENCIES = Statement("SELECT name, spec FROM objects WHERE kind = 'Job' AND spec NOT LIKE '%\"dependsOn\":[]%'")
_USED_PER_POOL = Statement("SELECT pool, sum(slots) AS used FROM admissions GROUP BY pool")
_QUEUED_PER_POOL = Statement("SELECT pool, count(*) AS queued FROM queue GROUP BY pool")
_USED_PER_NODE = Statement("SELECT node, sum(slots) AS used FROM admissions GROUP BY node")


@dataclass(frozen=True)
class PoolFacts:
    name: str
    capacity: int | None
    max_bypass: int
    used: int


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: dict[str, str]
    unschedulable: bool
    capacity: int
    allocated: int
    ready: bool
    cpu: float | None = None  # declared capacity (None: not counted on this node)
    memory: int | None = None
    cpu_allocated: float = 0.0
    memory_allocated: int = 0

    def allocated_status(self) -> dict[str, Any]:
        """status.allocated as shown: slots and, where the node declares them, cpu and memory."""
        allocated: dict[str, Any] = {"slots": self.allocated}
        if self.cpu is not None:
            allocated["cpu"] = format_cpu(self.cpu_allocated)
        if self.memory is not None:
            allocated["memory"] = format_size(self.memory_allocated)
        return allocated


def pool_facts(session: Connection, name: str) -> PoolFacts:
    return pool_facts_asked(session, name)()


def pool_facts_asked(session: Connection, name: str) -> Callable[[], PoolFacts]:
    """`pool_facts`, asked now and read when called: on a pipelined connection it travels
    with whatever is read before that."""
    result = _POOL_FACTS[name == "global"].execute(session, {"name": name})
    return lambda: _pool_facts(name, result)


def queued_with_pools(
    session: Connection, uid: str, pools: list[str]
) -> tuple[queuing.QueueEntry | None, dict[str, PoolFacts]]:
    """The job's queue row and the facts of these pools, all asked before any answer is read:
    one round trip on a pipelined connection, instead of one each."""
    entry = queuing.queued_asked(session, uid)
    facts = {p: pool_facts_asked(session, p) for p in pools}
    return entry(), {p: read() for p, read in facts.items()}


def _pool_facts(name: str, result: Result) -> PoolFacts:
    spec_text, used = result.one()
    spec = parse(spec_text) if spec_text else {}
    slots = spec.get("slots", "unlimited")
    return PoolFacts(name, None if slots == "unlimited" else int(slots), int(spec.get("maxBypass", 3)), int(used))


def node_facts(session: Connection, now: float | None = None) -> list[NodeFacts]:
    now = time.time() if now is None else now
    facts = []
    for row in _NODES.execute(session).all():
        spec, status = parse(row.spec), parse(row.status or "{}")
        declared = spec.get("capacity", {})
        capacity = declared.get("slots")
        if capacity is None:
            capacity = status.get("cpuCount") or 1
        fresh = heartbeat_fresh(status, now)
        cpu, memory = declared.get("cpu"), declared.get("memory")
        facts.append(
            NodeFacts(
                row.name,
                parse(row.labels),
                bool(spec.get("unschedulable")),
                int(capacity),
                int(row.allocated),
                fresh,
                None if cpu is None else parse_cpu(cpu),
                None if memory is None else parse_size(memory),
                float(row.cpu),
                int(row.memory),
            )
        )
    return facts


def admit(
    tx: Tx,
    *,
    uid: str,
    name: str,
    pool: str | None,
    slots: int,
    node: str,
    run_number: int,
    owner: str | None = None,
    port: int | None = None,
    cpu: float = 0.0,
    memory: int = 0,
) -> float:
    """Record the admission; `owner` claims the spawn at once when the admitting controller
    is the node's own agent; `port` is a service's, held on the node (a second admission of
    one port on one node is refused by the store); `cpu` and `memory` are the job's
    resources, held on the node."""
    now = time.time()
    tx.reported.pop(uid, None)
    _ADMIT.execute(
        tx.session,
        {
            "job_uid": uid,
            "job_name": name,
            "pool": pool,
            "slots": slots,
            "node": node,
            "run_number": run_number,
            "admitted_at": now,
            "owner": owner,
            "port": port,
            "cpu": cpu,
            "memory": memory,
            "epoch": tx.rv(),
        },
    )
    queuing.dequeue(tx, uid)  # an admitted job leaves its line in the same transaction
    return now


def ports_taken(session: Connection) -> dict[str, dict[int, str]]:
    """The ports services hold, by node: {node: {port: job name}}."""
    taken: dict[str, dict[int, str]] = {}
    for row in _PORTS.execute(session):
        taken.setdefault(row.node, {})[int(row.port)] = row.job_name
    return taken


@dataclass(frozen=True)
class Admission:
    """What starting a run needs of an admission row; `report` is what a remote agent last
    reported of its run (None: nothing yet, or the run is local)."""

    node: str | None
    run_number: int
    owner: str | None
    epoch: int | None = None
    report: dict[str, Any] | None = None


def admission(session: Connection, uid: str) -> Admission | None:
    row = _ADMISSION.execute(session, {"uid": uid}).first()
    if row is None:
        return None
    report = json.loads(row.report) if row.report else None
    return Admission(row.node, row.run_number, row.owner, row.epoch, report)


def claim_spawn(tx: Tx, uid: str, owner: str, *, take_over_from: str | None = None) -> bool:
    """Compare-and-swap the right to start this admission's run: no run starts twice."""
    tx.reported.pop(uid, None)
    if take_over_from is None:
        return _CLAIM.execute(tx.session, {"uid": uid, "owner": owner}).rowcount == 1
    return _TAKE_OVER.execute(tx.session, {"uid": uid, "owner": owner, "previous": take_over_from}).rowcount == 1


def restart_run(tx: Tx, uid: str, run_number: int, owner: str | None) -> None:
    """A service's next run under the admission it holds, claimed by the agent that
    restarts it (the one on its node; None: a remote agent, which the new epoch tells)."""
    tx.reported.pop(uid, None)
    _RESTART_RUN.execute(tx.session, {"uid": uid, "run_number": run_number, "owner": owner, "epoch": tx.rv()})


def release(tx: Tx, uid: str) -> tuple[str | None, int] | None:
    """Free the slots; returns (pool, slots) held, so the caller can wake who waits for them."""
    tx.reported.pop(uid, None)
    row = _RELEASE.execute(tx.session, {"uid": uid}).first()
    return None if row is None else (row.pool, row.slots)


def free(tx: Tx, uid: str) -> None:
    """`release` for a caller that knows what the job held: nothing waits for the answer
    (on a pipelined connection the delete travels with the next statement read)."""
    tx.reported.pop(uid, None)
    _FREE.execute(tx.session, {"uid": uid})


def round_robin_turn(tx: Tx) -> int:
    """A store-wide counter for the round-robin placement strategy."""
    turn = COUNT_UP.execute(tx.session, {"key": "rr"}).scalar()
    if turn is None:
        _ROUND_ROBIN_START.execute(tx.session)
        return 0
    return int(turn)


def changed_since(session: Connection, rv: int) -> list[Sequence[Any]]:
    """(kind, name, resourceVersion, uid) of objects written or deleted after `rv`: what a
    watcher must look at (deletions are seen through their events)."""
    written = _WRITTEN_SINCE.execute(session, {"rv": rv}).tuples()
    return written + _DELETED_SINCE.execute(session, {"rv": rv}).tuples()


def open_job_names(session: Connection) -> list[str]:
    """Jobs that are not Completed (or were never reconciled): the controller's start-up work."""
    return [row.name for row in _OPEN_JOBS.execute(session)]


def job_names_needing_revision(session: Connection) -> list[str]:
    """Completed jobs that may be due a new revision: their spec changed since they were
    reconciled, or a rerun was asked for (the reconciler tells an old request from a new)."""
    return [row.name for row in _MAY_NEED_REVISION.execute(session)]


def dependency_graph(session: Connection) -> dict[str, list[str]]:
    """job -> the jobs it depends on, for waking dependents when a job completes. Specs
    without dependencies (canonical JSON: `"dependsOn":[]`) are not even parsed."""
    rows = _DEPENDENCIES.execute(session)
    return {name: [d["job"] for d in json.loads(spec).get("dependsOn", [])] for name, spec in rows}


def usage(session: Connection) -> tuple[dict[str | None, int], dict[str | None, int], dict[str | None, int]]:
    """(slots used per pool, jobs queued per pool, slots allocated per node), for `get`."""
    used = {row.pool: int(row.used) for row in _USED_PER_POOL.execute(session)}
    queued_ = {row.pool: int(row.queued) for row in _QUEUED_PER_POOL.execute(session)}
    nodes = {row.node: int(row.used) for row in _USED_PER_NODE.execute(session)}
    return used, queued_, nodes


def round_robin_next(session: Connection) -> int:
    """The turn `round_robin_turn` would take now, without taking it: a job that finds no
    node must not use up a turn."""
    last = META.execute(session, {"key": "rr"}).scalar()
    return 0 if last is None else int(last) + 1


_ON_NODE = Statement(
    "SELECT job_uid, job_name, run_number, slots FROM admissions WHERE node = :node ORDER BY job_name, job_uid"
)


@dataclass(frozen=True)
class NodeAdmission:
    """An admission holding slots on one node: what `drain` waits for."""

    uid: str
    name: str
    run_number: int
    slots: int


def admissions_on(session: Connection, node: str) -> list[NodeAdmission]:
    return [
        NodeAdmission(row.job_uid, row.job_name, row.run_number, row.slots)
        for row in _ON_NODE.execute(session, {"node": node}).all()
    ]
