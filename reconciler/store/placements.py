"""What is placed on a node and what its agent reports: the admissions a remote node agent
runs (with their jobs' specs and statuses), the cheap key its long poll compares, and its
reports of each run's start and end, kept on the admission they name and refused as stale
when that admission is no longer current (released, another run, another epoch), and which
of the ended runs whose folders it holds the store still keeps."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from .dbapi import Connection, Statement
from .repository import in_chunks, in_marks
from .scheduling import Admission
from .transactions import Tx

_PLACED_ON = Statement(
    "SELECT a.job_uid, a.job_name, a.run_number, a.epoch, a.report, o.spec, o.phase, o.status FROM admissions AS a"
    " JOIN objects AS o ON o.kind = 'Job' AND o.uid = a.job_uid WHERE a.node = :node ORDER BY a.job_name"
)
_REPORT = Statement(
    "UPDATE admissions SET report = :report, reported_rv = :rv"
    " WHERE job_uid = :uid AND node = :node AND run_number = :run AND epoch = :epoch"
)
# the same, where the report also names the job, which must be the admission's
_NAMED_REPORT = Statement(
    "UPDATE admissions SET report = :report, reported_rv = :rv"
    " WHERE job_uid = :uid AND node = :node AND run_number = :run AND epoch = :epoch AND job_name = :job"
)
# The job's phase by a subquery on its uid alone, not a join: a join lets PostgreSQL's planner
# hash every Job (a fresh store's statistics say there are few; 2.3 ms a look at 3,000 jobs,
# the store's costliest statement in figure 20) where one unique-index probe per admission
# will do. No `kind = 'Job'` beside the uid (uids are unique store-wide): a statement without
# parameters keeps, on each connection, the plan of its first execution until objects is
# analyzed again (plan_cache_mode does not reach it), and one planned on a nearly empty store
# took the index on kind and filtered every Job by uid: 2,200 pages a look (README). With the
# uid alone, no index but the uid's can serve it. NULL: no such job (the join dropped the
# admission; so does the caller).
_PLACEMENT_KEYS = Statement(
    "SELECT a.node, a.job_uid, a.run_number, a.epoch,"
    " (SELECT CASE WHEN o.phase = 'Stopping' THEN o.resource_version ELSE 0 END FROM objects AS o"
    " WHERE o.uid = a.job_uid) AS stopping"
    " FROM admissions AS a WHERE a.node IS NOT NULL ORDER BY a.node, a.job_uid"
)
_REPORTED_SINCE = Statement("SELECT job_name, reported_rv, job_uid FROM admissions WHERE reported_rv > :rv")


_NODE_UID = Statement("SELECT uid FROM objects WHERE kind = 'Node' AND name = :name")


@functools.cache
def _jobs_by_uid(width: int) -> Statement:
    """The jobs of these uids, with a service's status (the spec and status of each other job,
    thousands of them at a look, are not read): a spec that may be a service's is one whose
    canonical text holds `"type":"service"` (`:service`), confirmed when decoded."""
    return Statement(
        "SELECT uid, CASE WHEN spec LIKE :service THEN spec END AS spec, CASE WHEN spec LIKE :service"
        f" THEN status END AS status FROM objects WHERE kind = 'Job' AND uid IN ({in_marks(width)})"
    )


@dataclass(frozen=True)
class Placed:
    """An admission on a node, with its job's stored spec and status (JSON text) and phase:
    what the node's agent is to run, or stop."""

    uid: str
    name: str
    run_number: int
    epoch: int | None
    report: dict[str, Any] | None
    spec: str
    phase: str | None
    status: str | None


def placed_on(session: Connection, node: str) -> list[Placed]:
    return [
        Placed(
            r.job_uid,
            r.job_name,
            r.run_number,
            r.epoch,
            json.loads(r.report) if r.report else None,
            r.spec,
            r.phase,
            r.status,
        )
        for r in _PLACED_ON.execute(session, {"node": node}).all()
    ]


def placement_keys(session: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Per node, what changes when anything its agent acts on may have changed (an admission,
    its epoch, its job Stopping or written while Stopping), without the specs and without
    the reports (the agent made those itself): the one cheap look the long polls of every
    node share after a write."""
    keys: dict[str, list[tuple[Any, ...]]] = {}
    for row in _PLACEMENT_KEYS.execute(session).all():
        if row.stopping is not None:  # its job is gone: nothing for an agent (placed_on joins it away)
            keys.setdefault(row.node, []).append((row.job_uid, row.run_number, row.epoch, row.stopping))
    return keys


def record_report(tx: Tx, *, uid: str, node: str, run: int, epoch: int, report: dict[str, Any]) -> bool:
    """Keep an agent's report on the admission it names; False when that admission is no
    longer current (released, another run, another epoch): the report is stale."""
    params = {"uid": uid, "node": node, "run": run, "epoch": epoch, "report": json.dumps(report, sort_keys=True)}
    return _REPORT.execute(tx.session, {**params, "rv": tx.rv()}).rowcount == 1


@dataclass(frozen=True)
class Report:
    """An agent's report of one run, named by its admission (uid, node, run, epoch) and, when
    given, its job's name (the admission's, as the agent's long poll said it): whom the
    controller steps when the report is kept."""

    uid: str
    run: int
    epoch: int
    facts: dict[str, Any]
    job: str = ""


def record_reports(tx: Tx, node: str, reports: list[Report]) -> list[bool]:
    """`record_report` of each, in this one transaction (on PostgreSQL one round trip for
    all): per report, whether it was kept (False: stale, as `record_report` says, or it
    names another job than its admission's)."""
    rv = tx.rv()
    kept = [False] * len(reports)
    for named, statement in ((True, _NAMED_REPORT), (False, _REPORT)):
        which = [i for i, r in enumerate(reports) if bool(r.job) == named]
        rows = [
            {
                "uid": reports[i].uid,
                "node": node,
                "run": reports[i].run,
                "epoch": reports[i].epoch,
                "rv": rv,
                "report": json.dumps(reports[i].facts, sort_keys=True),
                **({"job": reports[i].job} if named else {}),
            }
            for i in which
        ]
        if rows:
            for i, count in zip(which, statement.execute_each(tx.session, rows), strict=True):
                kept[i] = count == 1
    for report, ok in zip(reports, kept, strict=True):
        if ok:  # the admission is the one the report named, now with this report; no controller owns a remote run
            tx.reported[report.uid] = Admission(node, report.run, None, report.epoch, dict(report.facts))
    return kept


def reported_since(session: Connection, rv: int) -> list[tuple[str, int, str]]:
    """(job name, resourceVersion, job uid) of the reports written after `rv`: the jobs to look at."""
    return [(r.job_name, r.reported_rv, r.job_uid) for r in _REPORTED_SINCE.execute(session, {"rv": rv}).all()]


def kept_runs(session: Connection, node: str, runs: list[tuple[str, int, str]]) -> list[bool]:
    """For each (job uid, run number, node uid) whose folder the agent of `node` holds,
    whether the store still keeps that run: its job exists (a job deleted, or deleted and made
    again under its name, is another uid) and, for a service, the run is not older than the
    oldest its status keeps (a service's status drops its oldest runs' records, as the
    controller's own agent then removes their folders). A run started under another
    registration of the node than this store's (a new or another store, the Node deleted and
    registered again) is kept: what this store does not know of it proves nothing. What is
    not kept, the agent may remove."""
    registered = _NODE_UID.execute(session, {"name": node}).scalar()
    oldest: dict[str, int | None] = {}  # uid -> the oldest run its status keeps (None: every run)
    for width, params in in_chunks(uid for uid, _, _ in runs):
        for row in _jobs_by_uid(width).execute(session, {**params, "service": '%"type":"service"%'}).all():
            service = row.spec is not None and json.loads(row.spec).get("type") == "service"
            numbers = [r["number"] for r in json.loads(row.status or "{}").get("runs", [])] if service else []
            oldest[row.uid] = min(numbers) if numbers else None
    return [
        node_uid != registered or (uid in oldest and number >= (oldest[uid] or 0)) for uid, number, node_uid in runs
    ]
