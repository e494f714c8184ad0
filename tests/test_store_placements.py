"""The placement key every agent's long poll compares (`placements.placement_keys`): what it
holds, and that it stays one index probe per admission on a store PostgreSQL has no
statistics for yet (a fresh store under load, before any ANALYZE)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler.store import Store, placements
from reconciler.store import repository as repo
from reconciler.store import scheduling as sched
from reconciler.store.dbapi import Statement


def _jobs(tx: Any, count: int, *, stopping: int = 0) -> list[repo.StoredObject]:
    return repo.create_many(
        tx,
        [
            {
                "kind": "Job",
                "name": f"job-{n}",
                "spec": {"command": ["true"]},
                "labels": {},
                "annotations": {},
                "status": {"phase": "Stopping" if n < stopping else "Starting"},
            }
            for n in range(count)
        ],
    )


def _admit(tx: Any, uid: str, name: str, node: str) -> int:
    sched.admit(tx, uid=uid, name=name, pool=None, slots=1, node=node, run_number=1)
    return tx.rv()


def test_the_key_names_each_placed_run_its_epoch_and_a_stopping_jobs_version(store_url):
    store = Store(store_url)
    try:
        with store.write() as tx:
            stopping, starting, other = _jobs(tx, 3, stopping=1)
        with store.write() as tx:
            first = _admit(tx, stopping.uid, stopping.name, "n1")
            _admit(tx, starting.uid, starting.name, "n1")
            _admit(tx, other.uid, other.name, "n2")
            _admit(tx, "0000-no-such-job", "deleted", "n2")  # an admission whose job is gone
        with store.read() as session:
            keys = placements.placement_keys(session)
        assert keys == {
            "n1": sorted([(stopping.uid, 1, first, stopping.resource_version), (starting.uid, 1, first, 0)]),
            "n2": [(other.uid, 1, first, 0)],
        }
    finally:
        store.dispose()


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _plan_nodes(child)
    return found


def test_the_key_reads_each_admissions_job_by_its_uid_before_postgresql_has_statistics(pg_url):
    """A join let the planner, told by empty statistics that Jobs are few, hash every Job for
    each look (2.3 ms at 3,000 jobs, every 5 ms under load): the job is now read by uid."""
    store = Store(pg_url)
    try:
        with store.write() as tx:
            jobs = _jobs(tx, 3000)
        with store.write() as tx:
            for job in jobs[:24]:
                _admit(tx, job.uid, job.name, "n1")
        with store.read() as session:
            text = placements._PLACEMENT_KEYS.text(session)
            (row,) = Statement("EXPLAIN (FORMAT JSON) " + text).execute(session).all()
        plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        reads = [n for n in _plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == "objects"]
        assert reads, plan
        assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in reads), plan
        # a probe per admission (its uid the index condition), not a walk of every Job's uid
        assert all("uid" in n["Index Name"] and "job_uid" in n.get("Index Cond", "") for n in reads), plan
    finally:
        store.dispose()


def test_an_agent_is_told_which_ended_runs_the_store_still_keeps(store_url):
    """What a node agent may remove (`POST nodes/N/runs/kept`): the runs of a deleted job (its
    uid gone, even when a job of its name was made again) and a service's runs older than the
    oldest its status keeps; every run of a job that exists, and a service's newer runs; and
    every run taken on under another registration of the node than this store's (a new or
    another store knows none of its jobs: that proves nothing)."""
    store = Store(store_url)
    try:
        with store.write() as tx:
            kept_job, deleted, service = _jobs(tx, 3)
            (node,) = repo.create_many(
                tx, [{"kind": "Node", "name": "far", "spec": {}, "labels": {}, "annotations": {}}]
            )
            service = repo.update_object(
                tx,
                service,
                spec={"command": ["serve"], "type": "service"},
                status={"phase": "Running", "runs": [{"number": n} for n in (21, 22, 23)]},
            )
        with store.write() as tx:
            repo.remove(tx, deleted)
        with store.write() as tx:  # made again under the name: another uid
            (again,) = repo.create_many(
                tx,
                [{"kind": "Job", "name": deleted.name, "spec": {"command": ["true"]}, "labels": {}, "annotations": {}}],
            )
        here = node.uid
        asked = [
            (kept_job.uid, 1, here),
            (kept_job.uid, 7, here),  # a run job's runs all stay while the job does
            (deleted.uid, 1, here),
            (again.uid, 1, here),
            (service.uid, 20, here),  # dropped from the service's status: its folder may go
            (service.uid, 21, here),
            (service.uid, 24, here),  # newer than the status says yet (being started)
            ("0000-never-a-job", 1, here),
            ("0000-never-a-job", 2, "another-registration"),  # this store cannot tell
        ]
        with store.read() as session:
            kept = placements.kept_runs(session, "far", asked)
            elsewhere = placements.kept_runs(session, "nowhere", asked)  # a node this store never registered
        assert dict(zip(asked, kept, strict=True)) == {
            (kept_job.uid, 1, here): True,
            (kept_job.uid, 7, here): True,
            (deleted.uid, 1, here): False,
            (again.uid, 1, here): True,
            (service.uid, 20, here): False,
            (service.uid, 21, here): True,
            (service.uid, 24, here): True,
            ("0000-never-a-job", 1, here): False,
            ("0000-never-a-job", 2, "another-registration"): True,
        }
        assert all(elsewhere)
    finally:
        store.dispose()


def test_a_report_kept_in_a_batch_is_its_admission_as_read_until_anything_else_is_committed(store_url):
    """A step acting on a report handed to its batch takes the admission the report left
    (`Store.reported`) instead of reading it: the same as a read finds, in that transaction
    and in the thread's next one when nothing at all was committed between; not once another
    write came between, nor once its own transaction wrote the admission again."""
    store = Store(store_url)
    try:
        with store.write() as tx:
            job, other = _jobs(tx, 2)
            epoch = _admit(tx, job.uid, job.name, "n1")
            _admit(tx, other.uid, other.name, "n1")
        facts = {"startedAt": "2026-12-07T00:00:00Z", "finishedAt": "2026-12-07T00:00:01Z", "exitCode": 0}
        report = placements.Report(job.uid, 1, epoch, facts, job.name)
        with store.batch():
            with store.write(known=True) as tx:
                assert placements.record_reports(tx, "n1", [report]) == [True]
                read = sched.admission(tx.session, job.uid)
            assert read is not None and read.report == facts
            assert store.reported(job.uid) == read
            assert store.reported(other.uid) is None  # no report kept on it
            store.flush()
            with store.read():  # the next transaction: nothing was committed since
                assert store.reported(job.uid) == read
        with store.batch():
            with store.write(known=True) as tx:
                assert placements.record_reports(tx, "n1", [report]) == [True]
            store.flush()
            with store.write() as tx:  # another write (an agent's heartbeat, say) commits between
                repo.update_object(tx, other, status={"phase": "Running"})
            with store.read():
                assert store.reported(job.uid) is None
            with store.write(known=True) as tx:
                assert placements.record_reports(tx, "n1", [report]) == [True]
                sched.release(tx, job.uid)  # its own transaction writes the admission again
                assert store.reported(job.uid) is None
                elsewhere = placements.Report(other.uid, 1, epoch, facts, other.name)
                assert placements.record_reports(tx, "n1", [elsewhere]) == [True]
                sched.free(tx, other.uid)  # a release whose caller knows what was held
                assert store.reported(other.uid) is None
    finally:
        store.dispose()


def test_a_node_read_for_the_serving_check_is_read_again_once_anything_is_committed(store_url):
    """The check that an agent serves its node, made in the batch transaction that writes its
    reports, notes the Node as read (`Tx.nodes`): the worker's next transaction uses it when
    nothing at all was committed between, and reads it again after any commit (a heartbeat
    may be another agent's takeover) or once the transaction writes a Node."""
    import time

    from reconciler import noderuns
    from reconciler.errors import Conflict

    store = Store(store_url)
    try:
        beat = noderuns.Beat(agent="farhost:1:1.0", address="10.0.0.2", capacity={"slots": 1})
        noderuns.heartbeat(store, "far", beat, time.time())
        with store.batch():
            with store.write(known=True) as tx:
                noderuns.serving_in(tx.session, "far", "farhost:1:1.0", tx.nodes)
                node = tx.nodes["far"]
            store.flush()
            with store.write(known=True) as tx:  # nothing committed since: as read
                assert tx.nodes == {"far": node}
                with pytest.raises(Conflict):
                    noderuns.serving_in(tx.session, "far", "otherhost:2:2.0", tx.nodes)
            noderuns.heartbeat(store, "far", beat, time.time())  # a commit between
            with store.write(known=True) as tx:
                assert tx.nodes == {}
                noderuns.serving_in(tx.session, "far", "farhost:1:1.0", tx.nodes)
                assert tx.nodes["far"].resource_version > node.resource_version
                repo.update_object(tx, tx.nodes["far"], labels={"x": "y"})  # a Node written in it
                assert tx.nodes == {}
    finally:
        store.dispose()
