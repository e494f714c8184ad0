"""The store (reconciler.store): schema migration, the repository's compare-and-swap,
events written in the same transaction, resourceVersion order, and the SQLite file's
modes and settings. Store-level tests run on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from reconciler.errors import Conflict
from reconciler.store import Store, eventlog, placements, queuing
from reconciler.store import repository as repo
from reconciler.store import scheduling as sched
from reconciler.store.connect import BUSY_TIMEOUT_MS
from reconciler.store.dbapi import Statement
from reconciler.store.migrations import SCHEMA_VERSION
from tests.data.storedump import dump_store
from tests.helpers import run_cli

SPEC = {"command": ["true"], "slots": 1, "retry": {"limit": 2}}


class BoomError(Exception):
    """Raised inside a write transaction to make it roll back."""


@pytest.fixture
def store(store_url):
    s = Store(store_url)
    yield s
    s.dispose()


def _meta(store: Store) -> dict[str, int]:
    with store.read() as conn:
        return {k: int(v) for k, v in Statement("SELECT key, value FROM meta").execute(conn)}


def _tables(store: Store) -> set[str]:
    return set(dump_store(store.url))  # read by SQLAlchemy's inspector, apart from the store


_SET_SCHEMA = Statement("UPDATE meta SET value = :v WHERE key = 'schema'")


def _create(store: Store, name: str, *, kind: str = "Job", spec: dict | None = None, labels: dict | None = None):
    with store.write() as tx:
        obj = repo.create(
            tx,
            kind=kind,
            name=name,
            spec=spec or SPEC,
            labels=labels or {"app": name},
            annotations={"note": "x"},
            status={"phase": "Waiting"} if kind == "Job" else None,
        )
        eventlog.record(tx, eventlog.ObjectEvent(obj, "Created", f"{kind.lower()} created"))
    return obj


def _events(store: Store, name: str) -> list[tuple[str, str]]:
    with store.read() as conn:
        return [(e.reason, e.message) for e in eventlog.newest(conn, kind="Job", name=name)]


# --------------------------------------------------------------------------- schema


def test_migration_creates_tables_and_records_the_schema_version(store):
    assert {"objects", "events", "meta"} <= _tables(store)
    meta = _meta(store)
    assert meta["schema"] == SCHEMA_VERSION
    assert meta["seq"] == 0
    assert store.change_seq() == 0


def test_the_precompiled_ddl_is_what_tables_py_compiles_to():
    """A new store runs ddl.py's text, not SQLModel: the text must be exactly what SQLModel's
    create_all sends for tables.py on each dialect, so the two cannot drift."""
    from reconciler.store.ddl import DDL
    from reconciler.store.ddlgen import compile_ddl

    assert compile_ddl() == DDL, (
        "reconciler/store/ddl.py is stale: run `.venv/bin/python -m reconciler.store.ddlgen "
        "&& .venv/bin/ruff format reconciler/store/ddl.py`"
    )


def _options(options: dict) -> list[tuple[str, str]]:
    """An index's dialect options (a partial index's WHERE) as text."""
    return sorted((key, str(value)) for key, value in options.items())


def _schema(url: str) -> dict[str, dict]:
    """Each table's columns, primary key, unique constraints and indexes, as SQLAlchemy's
    inspector reads them from the database."""
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.pool import NullPool

    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            seen = inspect(conn)
            return {
                table: {
                    "columns": [
                        (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                        for c in seen.get_columns(table)
                    ],
                    "primary key": seen.get_pk_constraint(table)["constrained_columns"],
                    "unique": sorted(tuple(u["column_names"]) for u in seen.get_unique_constraints(table)),
                    "indexes": sorted(
                        (i["name"], tuple(i["column_names"]), bool(i["unique"]), _options(i.get("dialect_options", {})))
                        for i in seen.get_indexes(table)
                    ),
                }
                for table in sorted(seen.get_table_names())
            }
    finally:
        engine.dispose()


def test_a_new_store_has_the_schema_sqlmodel_creates(store_url):
    """The same database given its tables by SQLModel's create_all and then by a new Store
    (ddl.py) reads back the same: columns, types, keys, indexes (partial ones included)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool
    from sqlmodel import SQLModel

    from reconciler.store import tables  # noqa: F401  (registers the tables)

    url = store_url
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    try:
        SQLModel.metadata.create_all(engine)
        by_sqlmodel = _schema(url)
        SQLModel.metadata.drop_all(engine)
    finally:
        engine.dispose()
    assert set(by_sqlmodel) == set(SQLModel.metadata.tables)

    s = Store(store_url)
    try:
        by_store = _schema(url)
    finally:
        s.dispose()
    assert by_store == by_sqlmodel


_CREATE_IN_A_FRESH_INTERPRETER = """
import sys
from reconciler.store import Store

Store(sys.argv[1]).dispose()
print(sorted(m for m in sys.modules if m.partition(".")[0] in ("sqlalchemy", "sqlmodel")))
"""


def test_creating_a_store_does_not_import_sqlalchemy(store_url):
    """A new store's tables come from ddl.py's text: `up` on a fresh store does not pay for
    importing SQLAlchemy and SQLModel."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CREATE_IN_A_FRESH_INTERPRETER, store_url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    s = Store(store_url)
    try:
        assert _meta(s) == {"schema": SCHEMA_VERSION, "seq": 0}
    finally:
        s.dispose()


def test_a_commit_wakes_the_change_feeds_of_its_own_process(store_url, tmp_path):
    """A write's commit is announced to this process's followers at once (`up` sees its
    job's end as the controller writes it, not a poll later): on SQLite nothing else would
    tell them. The controller's own writes (known) do not wake its change watcher."""
    from reconciler.store.feed import ChangeFeed

    store = Store(store_url)
    try:
        every = ChangeFeed(store, listen=True)
        foreign = ChangeFeed(store, skip_known=True, listen=True)
        _create(store, "written")
        assert every.wait(60), "a commit in this process wakes its followers"
        assert foreign.wait(60), "a write that is not the controller's wakes its change watcher"
        assert [c.name for c in every.poll()] == ["written"]
    finally:
        store.dispose()

    sqlite = Store(f"sqlite:///{tmp_path / 'known' / 'state.db'}")  # no notifications that could move it
    try:
        watcher = ChangeFeed(sqlite, skip_known=True, listen=True)
        follower = ChangeFeed(sqlite, listen=True)
        with sqlite.write(known=True) as tx:
            repo.create(tx, kind="Job", name="own", spec=SPEC, labels={}, annotations={}, status=None)
        assert follower.wait(60)
        assert not watcher.wait(0.0), "the controller's own writes are not announced to its watcher"
        with sqlite.write() as tx:  # a write that changes nothing announces nothing
            tx.discard()
        assert not follower.wait(0.0)
    finally:
        sqlite.dispose()


def test_opening_an_existing_store_again_is_a_no_op(store_url):
    first = Store(store_url)
    obj = _create(first, "keep")
    before_meta, before_tables = _meta(first), _tables(first)
    first.dispose()

    again = Store(store_url)  # runs the migrator on a current store
    try:
        assert _meta(again) == before_meta
        assert _tables(again) == before_tables
        with again.read() as conn:
            stored = repo.get(conn, kind="Job", name="keep")
        assert stored is not None and stored.uid == obj.uid and stored.resource_version == obj.resource_version
        assert _events(again, "keep") == [("Created", "job created")]
    finally:
        again.dispose()


def test_a_store_from_a_newer_schema_is_refused(store_url):
    s = Store(store_url)
    with s.write() as tx:
        _SET_SCHEMA.execute(tx.session, {"v": SCHEMA_VERSION + 1})
    s.dispose()
    with pytest.raises(Exception, match=rf"store schema {SCHEMA_VERSION + 1} is newer than this reconciler"):
        Store(store_url)


def _downgrade(tx, *, to: int) -> None:
    """Make a current store's schema what version `to` created (what each upgrade undoes)."""
    if to < 9:
        tx.session.run("ALTER TABLE objects DROP COLUMN created_rv")
    if to < 8:
        tx.session.run("CREATE INDEX ix_objects_phase ON objects (phase)")
    if to < 7:
        for column in ("epoch", "report", "reported_rv"):
            tx.session.run(f"ALTER TABLE admissions DROP COLUMN {column}")
    if to < 6:
        for table in ("admissions", "queue"):
            for column in ("cpu", "memory"):
                tx.session.run(f"ALTER TABLE {table} DROP COLUMN {column}")
    if to < 5:
        tx.session.run("DROP TABLE leases")
    if to < 4:
        tx.session.run("DROP TABLE ingested")
    if to < 3:
        tx.session.run("DROP INDEX ix_objects_state")
        for column in ("outcome", "reason", "pool"):
            tx.session.run(f"ALTER TABLE objects DROP COLUMN {column}")
    if to < 2:
        tx.session.run("DROP TABLE outbox")
        tx.session.run("DROP TABLE deliveries")
        tx.session.run("DROP INDEX ix_admissions_node_port")
        tx.session.run("ALTER TABLE admissions DROP COLUMN port")
    _SET_SCHEMA.execute(tx.session, {"v": to})


def test_a_version_2_store_gets_the_state_columns_filled_from_its_documents(store_url):
    s = Store(store_url)
    done = _create(s, "done", spec={"command": ["true"], "pool": "batch"})
    with s.write() as tx:
        repo.update_object(
            tx, done, status={"phase": "Completed", "outcome": "Failed", "reason": "BackoffLimitExceeded"}
        )
        _downgrade(tx, to=2)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION
        with upgraded.read() as conn:
            rows = Statement("SELECT name, phase, outcome, reason, pool FROM objects WHERE kind = 'Job'").execute(conn)
            assert [tuple(r) for r in rows] == [("done", "Completed", "Failed", "BackoffLimitExceeded", "batch")]
    finally:
        upgraded.dispose()


def test_a_version_3_store_gets_the_ingested_table(store_url):
    """Source ingestion (schema 4): a store from before it can remember message ids once opened."""
    from reconciler.store import ingested

    s = Store(store_url)
    _create(s, "kept")
    with s.write() as tx:
        _downgrade(tx, to=3)
    assert "ingested" not in _tables(s)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION
        with upgraded.write() as tx:
            ingested.record(tx, "inbox", [("m1", "kept")], 1.0)
        with upgraded.read() as conn:
            assert ingested.job_of(conn, "inbox", "m1") == "kept"
            assert repo.get(conn, kind="Job", name="kept") is not None
    finally:
        upgraded.dispose()


def _object_indexes(store_url: str) -> set[str]:
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.pool import NullPool

    url = store_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return {i["name"] for i in inspect(conn).get_indexes("objects")}
    finally:
        engine.dispose()


def test_a_version_7_store_loses_the_index_on_phase_alone(store_url):
    """Schema 8: jobs are found by phase through ix_objects_state, which leads with the
    kind every such query names; the index on phase alone only cost writes."""
    s = Store(store_url)
    _create(s, "kept")
    with s.write() as tx:
        _downgrade(tx, to=7)
    assert "ix_objects_phase" in _object_indexes(store_url)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION
        assert {"ix_objects_resource_version", "ix_objects_state"} <= _object_indexes(store_url)
        assert "ix_objects_phase" not in _object_indexes(store_url)
        with upgraded.read() as conn:
            assert sched.open_job_names(conn) == ["kept"]
            if conn.dialect == "sqlite":  # found through the state index, not by reading every row
                plan = Statement(
                    "EXPLAIN QUERY PLAN SELECT name FROM objects WHERE kind = 'Job' AND phase = 'Completed'"
                ).execute(conn)
                assert any("ix_objects_state" in str(row[-1]) for row in plan)
    finally:
        upgraded.dispose()


def test_a_version_4_store_gets_the_leases_table(store_url):
    """The leader lease of serve (schema 5): a store from before it gets the table once opened."""
    s = Store(store_url)
    _create(s, "kept")
    with s.write() as tx:
        _downgrade(tx, to=4)
    assert "leases" not in _tables(s)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION
        assert {"ingested", "leases"} <= _tables(upgraded)
        with upgraded.read() as conn:
            assert repo.get(conn, kind="Job", name="kept") is not None
    finally:
        upgraded.dispose()


def test_a_version_5_store_gets_cpu_and_memory_on_admissions_and_queue_rows(store_url):
    """Admissions made before are kept, holding no cpu or memory (they were not counted);
    new ones hold the job's resources, summed per node."""
    from reconciler.store import queuing
    from reconciler.store import scheduling as sched

    s = Store(store_url)
    _create(s, "node-1", kind="Node", spec={"capacity": {"slots": 4, "cpu": "2", "memory": "1Gi"}})
    with s.write() as tx:
        sched.admit(tx, uid="u1", name="old", pool=None, slots=1, node="node-1", run_number=1)
        _downgrade(tx, to=5)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION
        with upgraded.write() as tx:
            sched.admit(
                tx, uid="u2", name="new", pool=None, slots=1, node="node-1", run_number=1, cpu=0.5, memory=1 << 29
            )
            queuing.enqueue(
                tx,
                uid="u3",
                name="waiting",
                pool=None,
                slots=1,
                priority=0,
                eligible_at=0.0,
                bypass_count=0,
                node_name=None,
                node_selector={},
                cpu=1.5,
                memory=1 << 20,
            )
        with upgraded.read() as conn:
            (facts,) = sched.node_facts(conn)
            assert (facts.cpu, facts.memory, facts.cpu_allocated, facts.memory_allocated) == (
                2.0,
                1 << 30,
                0.5,
                1 << 29,
            )
            assert facts.allocated_status() == {"slots": 2, "cpu": "500m", "memory": "512Mi"}
            queued = queuing.queued(conn, "u3")
            assert queued is not None and (queued.cpu, queued.memory) == (1.5, 1 << 20)
    finally:
        upgraded.dispose()


def test_a_version_8_store_gets_creation_versions_its_old_objects_reading_as_made_at_0(store_url):
    """Schema 9: an object records the resourceVersion that created it (a watch tells ADDED
    from MODIFIED by it); one made before reads as made at 0, before any watch."""
    s = Store(store_url)
    old = _create(s, "old")
    with s.write() as tx:
        _downgrade(tx, to=8)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION
        new = _create(upgraded, "new")
        assert new.created_rv == new.resource_version > old.resource_version
        with upgraded.write() as tx:
            changed = repo.update_object(tx, new, labels={"t": "x"})
        assert changed.created_rv == new.created_rv < changed.resource_version
        with upgraded.read() as conn:
            assert repo.get(conn, kind="Job", name="old").created_rv == 0
            assert repo.get(conn, kind="Job", name="new").created_rv == new.resource_version
    finally:
        upgraded.dispose()


def test_a_version_6_store_gets_admission_epochs_and_keeps_its_admissions(store_url):
    """Schema 7: admissions carry an epoch and a remote agent's report. One made before has
    neither (no agent can report on it); a new admission gets its epoch, and a report names
    it: one for another epoch is refused."""
    from reconciler.store import placements
    from reconciler.store import scheduling as sched

    s = Store(store_url)
    with s.write() as tx:
        _downgrade(tx, to=6)
        Statement(
            "INSERT INTO admissions (job_uid, job_name, pool, slots, node, run_number, admitted_at)"
            " VALUES ('u1', 'old', NULL, 1, 'n1', 1, 0)"
        ).execute(tx.session)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION
        with upgraded.read() as conn:
            assert sched.admission(conn, "u1") == sched.Admission("n1", 1, None, None, None)
        with upgraded.write() as tx:
            sched.admit(tx, uid="u2", name="new", pool=None, slots=1, node="n2", run_number=1)
            epoch = tx.rv()
        with upgraded.write() as tx:
            assert not placements.record_report(tx, uid="u2", node="n2", run=1, epoch=epoch + 1, report={"pid": 1})
            assert placements.record_report(tx, uid="u2", node="n2", run=1, epoch=epoch, report={"pid": 1})
        with upgraded.read() as conn:
            assert sched.admission(conn, "u2") == sched.Admission("n2", 1, None, epoch, {"pid": 1})
            assert [name for name, _, _ in placements.reported_since(conn, epoch)] == ["new"]
    finally:
        upgraded.dispose()


def test_a_version_1_store_is_upgraded_in_place_keeping_its_objects_and_admissions(store_url):
    """A store made before notifier delivery and service ports (schema 1: no outbox, no
    admissions.port) gets them when opened, and keeps what it held."""
    from reconciler.store import scheduling as sched
    from reconciler.store.dbapi import StoreError

    s = Store(store_url)
    obj = _create(s, "old")
    with s.write() as tx:
        _downgrade(tx, to=1)
        Statement(
            "INSERT INTO admissions (job_uid, job_name, pool, slots, node, run_number, admitted_at)"
            " VALUES ('u1', 'old', NULL, 1, 'n1', 1, 0)"
        ).execute(tx.session)
    s.dispose()

    upgraded = Store(store_url)
    try:
        assert _meta(upgraded)["schema"] == SCHEMA_VERSION == 9
        assert {"outbox", "deliveries", "ingested", "leases"} <= _tables(upgraded)
        with upgraded.read() as conn:
            assert repo.get(conn, kind="Job", name="old").uid == obj.uid
            assert Statement("SELECT count(*) FROM outbox").execute(conn).scalar() == 0
            assert sched.admission(conn, "u1") == sched.Admission("n1", 1, None, None, None)
        with upgraded.write() as tx:
            sched.admit(tx, uid="u2", name="web", pool=None, slots=1, node="n1", run_number=1, port=8080)
        with pytest.raises(StoreError), upgraded.write() as tx:  # one service per port and node
            sched.admit(tx, uid="u3", name="web2", pool=None, slots=1, node="n1", run_number=1, port=8080)
        with upgraded.read() as conn:
            assert sched.ports_taken(conn) == {"n1": {8080: "web"}}
    finally:
        upgraded.dispose()


def test_the_cli_refuses_a_newer_store_with_one_line(sqlite_url):
    s = Store(sqlite_url)
    with s.write() as tx:
        _SET_SCHEMA.execute(tx.session, {"v": SCHEMA_VERSION + 1})
    s.dispose()
    result = run_cli("get", "jobs", store=sqlite_url)
    assert result.code != 0
    assert "newer than this reconciler" in result.stderr
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- objects


def test_create_get_and_list(store):
    for name in ("b-job", "a-job", "c-job"):
        _create(store, name)
    _create(store, "main", kind="Pool", spec={"slots": 2})
    with store.read() as conn:
        got = repo.get(conn, kind="Job", name="a-job")
        missing = repo.get(conn, kind="Job", name="nope")
        other_kind = repo.get(conn, kind="Pool", name="a-job")
        jobs = repo.list_objects(conn, kind="Job")
        some = repo.list_objects(conn, kind="Job", names=["c-job", "a-job", "nope"])
        pools = repo.list_objects(conn, kind="Pool")
    assert missing is None and other_kind is None
    assert got is not None
    assert (got.kind, got.name, got.generation) == ("Job", "a-job", 1)
    assert got.spec == SPEC and got.labels == {"app": "a-job"} and got.annotations == {"note": "x"}
    assert got.status == {"phase": "Waiting"} and got.deleted_at is None and got.uid
    assert got.spec_text == repo.canonical(SPEC)
    assert [o.name for o in jobs] == ["a-job", "b-job", "c-job"]  # ordered by name
    assert [o.name for o in some] == ["a-job", "c-job"]
    assert [(o.kind, o.name, o.spec) for o in pools] == [("Pool", "main", {"slots": 2})]
    assert len({o.uid for o in jobs + pools}) == 4
    manifest = got.manifest()
    assert manifest["metadata"]["resourceVersion"] == str(got.resource_version)
    # the wire form spells a job's unset outcome and reason null (API.md 1.2); the store does not
    assert manifest["spec"] == SPEC and manifest["status"] == {"phase": "Waiting", "outcome": None, "reason": None}


def test_create_many_is_create_for_many(store):
    with store.write() as tx:
        made = repo.create_many(
            tx,
            [
                {"kind": "Job", "name": f"j{i}", "spec": SPEC, "labels": {"i": str(i)}, "annotations": {}}
                for i in range(3)
            ],
        )
        eventlog.record(tx, *(eventlog.ObjectEvent(o, "Created", "bulk") for o in made))
    assert {o.resource_version for o in made} == {store.change_seq()}
    with store.read() as conn:
        stored = repo.list_objects(conn, kind="Job")
    assert [(o.name, o.uid, o.labels, o.spec, o.status) for o in stored] == [
        (o.name, o.uid, o.labels, o.spec, None) for o in made
    ]
    assert _events(store, "j1") == [("Created", "bulk")]


def test_update_bumps_resource_version_and_generation_only_on_a_spec_change(store):
    obj = _create(store, "web")
    assert obj.generation == 1

    # the same spec, spelled in another key order, is no change of spec
    reordered = {"retry": {"limit": 2}, "slots": 1, "command": ["true"]}
    with store.write() as tx:
        same = repo.update_object(tx, obj, spec=reordered, labels={"app": "web", "tier": "front"})
    assert same.resource_version > obj.resource_version
    assert same.generation == 1 and same.labels == {"app": "web", "tier": "front"}

    with store.write() as tx:
        status_only = repo.update_object(tx, same, status={"phase": "Queued"})
    assert status_only.resource_version > same.resource_version and status_only.generation == 1

    with store.write() as tx:
        changed = repo.update_object(tx, status_only, spec={**SPEC, "priority": 5})
    assert changed.generation == 2 and changed.resource_version > status_only.resource_version

    with store.read() as conn:
        stored = repo.get(conn, kind="Job", name="web")
    assert stored is not None
    assert (stored.generation, stored.resource_version) == (2, changed.resource_version)
    assert stored.spec == {**SPEC, "priority": 5} and stored.status == {"phase": "Queued"}
    assert stored.labels == {"app": "web", "tier": "front"} and stored.uid == obj.uid


def test_a_stale_update_raises_conflict_and_changes_nothing(store):
    obj = _create(store, "web")
    with store.write() as tx:
        fresh = repo.update_object(tx, obj, labels={"app": "first"})
        eventlog.record(tx, eventlog.ObjectEvent(fresh, "Configured", "first"))
    seq = store.change_seq()

    with pytest.raises(Conflict, match="has been modified"), store.write() as tx:
        stale = repo.update_object(tx, obj, spec={**SPEC, "priority": 9}, labels={"app": "second"})
        eventlog.record(tx, eventlog.ObjectEvent(stale, "Configured", "second"))  # never reached
    with pytest.raises(Conflict), store.write() as tx:
        repo.remove(tx, obj)

    assert store.change_seq() == seq
    with store.read() as conn:
        stored = repo.get(conn, kind="Job", name="web")
    assert stored is not None
    assert (stored.resource_version, stored.generation, stored.labels, stored.spec) == (
        fresh.resource_version,
        1,
        {"app": "first"},
        SPEC,
    )
    assert _events(store, "web") == [("Created", "job created"), ("Configured", "first")]


def test_remove_is_a_compare_and_swap(store):
    obj = _create(store, "gone")
    with store.write() as tx:
        repo.remove(tx, obj)
        eventlog.record(tx, eventlog.ObjectEvent(obj, "Deleted", "job deleted"))
    with store.read() as conn:
        assert repo.get(conn, kind="Job", name="gone") is None
    assert _events(store, "gone")[-1] == ("Deleted", "job deleted")


# --------------------------------------------------------------------------- transactions


def test_events_are_written_in_the_same_transaction(store):
    with pytest.raises(BoomError), store.write() as tx:
        obj = repo.create(tx, kind="Job", name="ghost", spec=SPEC, labels={}, annotations={})
        eventlog.record(tx, eventlog.ObjectEvent(obj, "Created", "job created"))
        raise BoomError
    with store.read() as conn:
        assert repo.get(conn, kind="Job", name="ghost") is None
    assert _events(store, "ghost") == []
    assert store.change_seq() == 0

    obj = _create(store, "real")
    seq = store.change_seq()
    with pytest.raises(BoomError), store.write() as tx:
        updated = repo.update_object(tx, obj, spec={**SPEC, "priority": 1})
        eventlog.record(tx, eventlog.ObjectEvent(updated, "Configured", "spec changed"))
        raise BoomError
    with store.read() as conn:
        stored = repo.get(conn, kind="Job", name="real")
    assert stored is not None and stored.spec == SPEC and stored.resource_version == obj.resource_version
    assert _events(store, "real") == [("Created", "job created")]
    assert store.change_seq() == seq


@pytest.mark.parametrize("kept", [4, queuing.HEADS])
def test_the_heads_of_line_a_batch_epoch_keeps_are_the_lines_as_a_read_finds_them(store, kept, monkeypatch):
    """`first_in_line` with the batch's epoch keeps each scope's first entries and follows its
    own enqueues and dequeues (a row already there, a pool changed, ties on rank and time,
    commits within the epoch): whatever the sequence, it names who a read of the line names,
    and it reads the line only when too few entries are kept."""
    import random

    monkeypatch.setattr(queuing, "HEADS", kept)  # few: the edges of the kept heads are met often
    rng = random.Random(20261207)
    uids = [f"0000-{i:04d}" for i in range(80)]
    queued: set[str] = set()
    cached_reads = 0
    with store.batch():
        for step in range(400):
            with store.write(known=True) as tx:
                uid = rng.choice(uids)
                if uid in queued and rng.random() < 0.5 - 0.3 * (len(queued) < 50):
                    queuing.dequeue(tx, uid)
                    queued.discard(uid)
                else:
                    queuing.enqueue(
                        tx,
                        uid=uid,
                        name=f"job-{uid}",
                        pool=rng.choice([None, "p"]),
                        slots=1,
                        priority=rng.choice([0, 0, 1]),
                        eligible_at=float(rng.randint(0, 40)),
                        bypass_count=0,
                        node_name=None,
                        node_selector={},
                        fresh=rng.random() < 0.7,
                    )()
                    queued.add(uid)
                epoch = store.epoch(open=False)
                for scope in (None, "p"):
                    limit = rng.choice([1, 2, kept - 1, kept, kept + 1])
                    cached_reads += scope in epoch.memo.get("queue-heads", {})
                    got = queuing.first_in_line(tx.session, scope, limit, epoch)
                    assert got == queuing.first_in_line(tx.session, scope, limit), (step, scope, limit)
            if step % 60 == 59:
                store.flush()  # the epoch goes on: nothing else committed
    assert cached_reads > 200  # most looks were answered from the kept heads


def test_a_queue_write_alone_moves_the_change_sequence(store):
    """Another worker's batch epoch, and the heads of line kept in it, go on only while the
    change sequence stays where that worker's commit left it: a transaction that writes the
    queue and no object must move it too."""
    args = dict(pool=None, slots=1, priority=0, node_name=None, node_selector={}, bypass_count=0)
    for write in (
        lambda tx: queuing.enqueue(tx, uid="0000-1", name="a", eligible_at=1.0, fresh=True, **args)(),
        lambda tx: queuing.count_bypass(tx, "0000-1"),
        lambda tx: queuing.dequeue(tx, "0000-1"),
    ):
        before = store.change_seq()
        with store.write(known=True) as tx:
            write(tx)
        assert store.change_seq() == before + 1


def test_first_in_line_names_as_many_as_asked_past_the_kept_heads(store):
    """A release of more slots than the heads kept (64) wakes as many jobs as it freed: the
    line is read on for them, with or without a batch epoch."""
    with store.batch(), store.write(known=True) as tx:
        for n in range(100):
            args = dict(pool=None, slots=1, priority=0, node_name=None, node_selector={}, bypass_count=0)
            queuing.enqueue(tx, uid=f"0000-{n:04d}", name=f"j{n:03d}", eligible_at=float(n), fresh=True, **args)
        epoch = store.epoch(open=False)
        expected = [f"j{n:03d}" for n in range(80)]
        assert queuing.first_in_line(tx.session, None, 80, epoch) == expected
        assert queuing.first_in_line(tx.session, None, 80) == expected
        assert queuing.first_in_line(tx.session, None, 3, epoch) == expected[:3]


def test_the_events_of_a_batch_keep_their_order_and_write_and_a_rolled_back_batch_has_none(store):
    """Events are appended with the commit (all of a transaction's in one statement on
    PostgreSQL): a batch of two writes keeps each event's order, type, object and the
    resourceVersion of the write that appended it, a NUL in a message (an agent's words)
    spelled out, which PostgreSQL's text cannot hold; a batch rolled back writes none."""
    first, second = _create(store, "first"), _create(store, "second")
    with store.batch():
        with store.write(known=True) as tx:
            a = repo.update_object(tx, first, spec={**SPEC, "priority": 1})
            eventlog.record(tx, eventlog.ObjectEvent(a, "One", "a 1"), eventlog.ObjectEvent(a, "Two", "a 2", True))
            eventlog.record(tx, eventlog.ObjectEvent(second, "Three", "b\x003"))
        rv = a.resource_version
    with store.read() as conn:
        got = [(e.name, e.reason, e.message, e.type, e.resource_version) for e in eventlog.newest(conn)]
    assert got[-3:] == [
        ("first", "One", "a 1", "Normal", rv),
        ("first", "Two", "a 2", "Warning", rv),
        ("second", "Three", "b\\03", "Normal", rv),
    ]
    with pytest.raises(BoomError), store.batch(), store.write(known=True) as tx:
        eventlog.record(tx, eventlog.ObjectEvent(repo.update_object(tx, a, spec=SPEC), "Lost", "rolled back"))
        raise BoomError
    assert _events(store, "first")[-1] == ("Two", "a 2")


def test_a_read_is_one_snapshot_for_all_its_statements(store):
    """What a reconcile step reads together (a job and its dependencies) is from one moment,
    on PostgreSQL too (REPEATABLE READ reads; its default would give each statement its own)."""
    obj = _create(store, "snap")
    with store.read() as conn:
        before = repo.get(conn, kind="Job", name="snap")
        with store.write() as tx:  # another connection commits meanwhile
            repo.update_object(tx, obj, labels={"seen": "later"})
        again = repo.get(conn, kind="Job", name="snap")
    assert again.labels == before.labels == {"app": "snap"}
    with store.read() as conn:
        assert repo.get(conn, kind="Job", name="snap").labels == {"seen": "later"}


def test_resource_versions_grow_monotonically_across_transactions(store):
    seen: list[int] = []
    obj = _create(store, "counter", labels={"n": "0"})
    seen.append(obj.resource_version)
    for i in range(1, 6):
        with store.write() as tx:
            rv = tx.rv()
            assert tx.rv() == rv  # one resourceVersion per transaction
            other = repo.create(tx, kind="Job", name=f"side-{i}", spec=SPEC, labels={}, annotations={})
            obj = repo.update_object(tx, obj, labels={"n": str(i)})
            assert other.resource_version == obj.resource_version == rv
        seen.append(obj.resource_version)
        assert store.change_seq() == obj.resource_version
    with store.write() as tx:  # a transaction that writes nothing takes no resourceVersion
        with_nothing = tx
    assert not with_nothing.changed
    assert store.change_seq() == seen[-1]
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    with store.read() as conn:
        events = eventlog.newest(conn)
    rvs = [e.resource_version for e in events]
    assert rvs == sorted(rvs)


# --------------------------------------------------------------------------- SQLite specifics


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_sqlite_file_and_folder_are_private(tmp_path):
    folder = tmp_path / "fresh" / "state"
    path = folder / "state.db"
    s = Store(f"sqlite:///{path}")
    try:
        _create(s, "one")
        with s.read() as conn:  # keeps a reader open, so -wal and -shm exist meanwhile
            repo.list_objects(conn, kind="Job")
            assert _mode(folder) == 0o700
            assert _mode(path) == 0o600
            extra = [folder / f"state.db{suffix}" for suffix in ("-wal", "-shm")]
            present = [p for p in extra if p.exists()]
            assert present, "WAL mode keeps -wal/-shm files while a connection is open"
            for p in present:
                assert _mode(p) == 0o600, p
    finally:
        s.dispose()


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(sqlite_url):
    s = Store(sqlite_url)
    try:
        journal_mode, busy_timeout = Statement("PRAGMA journal_mode"), Statement("PRAGMA busy_timeout")
        with s.read() as conn:
            assert journal_mode.execute(conn).scalar().lower() == "wal"
            assert busy_timeout.execute(conn).scalar() == BUSY_TIMEOUT_MS
        with s.write() as tx:
            assert journal_mode.execute(tx.session).scalar().lower() == "wal"
            assert busy_timeout.execute(tx.session).scalar() == BUSY_TIMEOUT_MS
    finally:
        s.dispose()


# --------------------------------------------------------------------------- SQL text and connections

PG_ONLY = {
    "_LOCK_SEQ",
    "_LOCK_SEQ_TERM",
    "_NOTIFY",
    "_ONE_MIGRATOR",
    "_HAS_META[postgresql]",
    "_NOW[postgresql]",
    "_update_certain(every column)",  # sent only on a pipelined connection
    "_INSERT_EVENTS",  # a transaction's events as arrays (unnest)
}
SQLITE_ONLY = {"_HAS_META[sqlite]", "_NOW[sqlite]"}


def _runtime_statements() -> dict[str, Statement]:
    """Every statement the store runs, by name: the module-level ones of every module of the
    store (found, so that a new module or a moved statement cannot be left out), and one of
    each shape the cached builders make (a new builder must be added here, or this fails)."""
    import importlib
    import pkgutil

    import reconciler.store
    from reconciler.store import ingested, queuing

    modules = [
        importlib.import_module(f"reconciler.store.{m.name}") for m in pkgutil.iter_modules(reconciler.store.__path__)
    ]
    assert {"engine", "repository", "queuing", "placements", "transactions"} <= {
        m.__name__.rsplit(".")[-1] for m in modules
    }
    found: dict[str, Statement] = {}
    for module in modules:
        for name, value in vars(module).items():
            if isinstance(value, Statement):
                found[name] = value
            elif isinstance(value, dict) and value and all(isinstance(v, Statement) for v in value.values()):
                found.update({f"{name}[{key}]": v for key, v in value.items()})
    builders = {name for m in modules for name, v in vars(m).items() if hasattr(v, "cache_info")}
    builders.discard("_pipeline_supported")  # dbapi's probe of libpq, not a statement
    assert builders == {
        "_list_named",
        "_statuses_named",
        "_update",
        "_update_certain",
        "_events",
        "_line",
        "_find_many",
        "_jobs_by_uid",
    }, "cover the new builder below"
    found["_list_named(4)"] = repo._list_named(4)
    found["_jobs_by_uid(4)"] = placements._jobs_by_uid(4)
    found["_find_many(4)"] = ingested._find_many(4)
    found["_statuses_named(4)"] = repo._statuses_named(4)
    every_column = ("resource_version", "spec", "generation", "labels", "annotations", "status", "phase")
    found["_update(every column)"] = repo._update((*every_column, "observed_generation", "deleted_at"))
    found["_update_certain(every column)"] = repo._update_certain((*every_column, "observed_generation", "deleted_at"))
    for by_kind in (False, True):
        for by_name in (False, True):
            found[f"_events({by_kind}, {by_name})"] = eventlog._events(by_kind, by_name)
    for in_pool in (False, True):
        for after in (False, True):
            found[f"_line({in_pool}, {after})"] = queuing._line(in_pool, after, 16)
    return found


def test_every_runtime_statement_is_valid_against_the_schema_sqlmodel_creates(store):
    """The SQL text is written apart from tables.py: each statement is compiled by the
    database (EXPLAIN) on a store whose schema SQLModel created, so a renamed or dropped
    column cannot go unnoticed."""
    import re

    dialect = "sqlite" if store.is_sqlite else "postgresql"
    skip = PG_ONLY if store.is_sqlite else SQLITE_ONLY
    statements = {n: s for n, s in _runtime_statements().items() if n not in skip}
    assert len(statements) > 40
    failures = []
    for name, statement in statements.items():
        params = dict.fromkeys(re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", re.sub(r"'[^']*'", "", statement.sqlite)))
        with store.write() as tx:
            tx.discard()
            try:
                tx.session.run("EXPLAIN " + statement.text(tx.session), params)
            except Exception as exc:
                failures.append(f"{name} on {dialect}: {exc}\n  {statement.sqlite}")
    assert not failures, "\n".join(failures)


def test_values_given_by_position_are_stored_as_by_name(store):
    """Statement.execute_values (tuples in the order the text names its parameters) on both
    drivers: many rows, one row, a `%` in a literal; a text naming one parameter twice is
    refused, for a tuple could not give it twice."""
    insert = Statement(
        "INSERT INTO ingested (source, message_id, job, created_at)"
        " VALUES (:source, :message_id || '%', :job, :created_at)"
    )
    with store.write() as tx:
        insert.execute_values(tx.session, [("s", "m1", "job-1", 1.0), ("s", "m2", "job-2", 2.5)])
        insert.execute_values(tx.session, [("s", "m3", "job-3", 3.0)])
        insert.execute_values(tx.session, [])
    read = Statement("SELECT message_id, job, created_at FROM ingested WHERE source = :s ORDER BY created_at")
    with store.read() as conn:
        rows = [tuple(r) for r in read.execute(conn, {"s": "s"}).all()]
    assert rows == [("m1%", "job-1", 1.0), ("m2%", "job-2", 2.5), ("m3%", "job-3", 3.0)]
    with pytest.raises(ValueError, match="named twice"), store.write() as tx:
        Statement("SELECT :a, :a").execute_values(tx.session, [(1, 2)])


def _version(obj):
    return obj.uid, obj.resource_version, obj.labels


def test_a_write_inside_a_read_fails(store):
    """Read transactions refuse writes on both stores (SQLite: query_only; PostgreSQL: READ
    ONLY), through the repository and through plain SQL, and the connection reads on."""
    from reconciler.store.dbapi import StoreError
    from reconciler.store.transactions import Tx

    obj = _create(store, "kept")
    seq = store.change_seq()
    with pytest.raises(StoreError, match=r"read-?only"), store.read() as conn:
        repo.update_object(Tx(conn, store), obj, labels={"changed": "yes"})
    with pytest.raises(StoreError, match=r"read-?only"), store.read() as conn:
        Statement("DELETE FROM objects").execute(conn)
    with store.read(), pytest.raises(StoreError, match=r"read-?only"), store.read() as nested:  # its own connection
        Statement("DELETE FROM events").execute(nested)
    with store.read() as conn:
        assert _version(repo.get(conn, kind="Job", name="kept")) == _version(obj)
    assert store.change_seq() == seq
    assert _events(store, "kept") == [("Created", "job created")]


_READ_IN_A_FRESH_INTERPRETER = """
import sys
from reconciler.store import Store
from reconciler.store import repository as repo

store = Store(sys.argv[1])
with store.read() as conn:
    assert repo.get(conn, kind="Job", name="present").name == "present"
    assert [o.name for o in repo.list_objects(conn, kind="Job", names=["present", "absent"])] == ["present"]
store.dispose()
sys.argv = ["reconciler", "--store", sys.argv[1], "get", "job", "present"]
from reconciler.cli.app import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(sorted(m for m in sys.modules if m.partition(".")[0] in ("sqlalchemy", "sqlmodel")))
"""


def test_reading_a_current_store_does_not_import_sqlalchemy(store_url):
    """SQLAlchemy and SQLModel define and create the schema; reading a store that has it
    (what `reconciler get` does) must not pay for importing them."""
    import subprocess
    import sys

    first = Store(store_url)
    _create(first, "present")
    first.dispose()
    done = subprocess.run(
        [sys.executable, "-c", _READ_IN_A_FRESH_INTERPRETER, store_url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


def test_a_lost_postgresql_connection_is_replaced(pg_url):
    """A server that ended the store's sessions (a restart, pg_terminate_backend): an idle
    connection found ended is replaced before use; one lost inside a transaction fails that
    transaction and is never used again."""
    import psycopg

    from reconciler.store.dbapi import StoreError

    backend = Statement("SELECT pg_backend_pid()")
    store = Store(pg_url)
    admin = psycopg.connect(pg_url, autocommit=True)
    try:
        obj = _create(store, "survivor")
        with store.read() as conn:
            reader = backend.execute(conn).scalar()
        with store.write() as tx:
            writer = backend.execute(tx.session).scalar()
        admin.execute("SELECT pg_terminate_backend(pid, 5000) FROM unnest(%s::int[]) AS pid", [[reader, writer]])

        with store.read() as conn:  # between transactions: replaced before use
            assert _version(repo.get(conn, kind="Job", name="survivor")) == _version(obj)
            assert backend.execute(conn).scalar() != reader
        with store.write() as tx:
            assert backend.execute(tx.session).scalar() != writer
            obj = repo.update_object(tx, obj, labels={"after": "restart"})

        with pytest.raises(StoreError), store.read() as conn:  # inside one: that transaction fails
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", [backend.execute(conn).scalar()])
            repo.get(conn, kind="Job", name="survivor")
        with store.read() as conn:
            assert _version(repo.get(conn, kind="Job", name="survivor")) == _version(obj)
    finally:
        admin.close()
        store.dispose()


def test_a_store_that_cannot_be_reached_raises_store_error():
    from reconciler.store.dbapi import StoreError

    with pytest.raises(StoreError):
        Store("postgresql://postgres@127.0.0.1:1/nowhere")


def test_new_uids_are_version_7_uuids_in_creation_order():
    import time
    import uuid

    before = time.time_ns() // 1_000_000
    made = [repo.new_uid() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert len(set(made)) == 2000
    for text in made:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after  # the first 48 bits: milliseconds since the epoch
    # ordered by the millisecond they were made in (within one, by their random bits)
    stamps = [uuid.UUID(text).int >> 80 for text in made]
    assert stamps == sorted(stamps)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_statuses_of_named_objects_are_those_that_exist(store, count):
    """One name alone, or many at once (on PostgreSQL one query for them all): each that exists,
    with its status decoded; a missing name or another kind's object is left out."""
    names = [f"job-{i}" for i in range(count)]
    for name in names:
        _create(store, name)
    _create(store, "job-pool", kind="Pool", spec={"slots": 2})
    with store.read() as conn:
        found = repo.statuses(conn, kind="Job", names=[*reversed(names), "nope", "job-pool", names[0]])
    assert sorted(found) == sorted(names)
    for name in names:
        observed = found[name]
        assert (observed.name, observed.status, observed.spec_text) == (
            name,
            {"phase": "Waiting"},
            repo.canonical(SPEC),
        )
        assert observed.annotations == {"note": "x"}


def test_the_rows_of_an_insert_land_whole_and_in_order_however_many(store):
    """`Statement.execute_rows`: no row, one (a plain execute) and several (executemany,
    pipelined on PostgreSQL) insert exactly the rows given, in order, string literals with a
    colon and values with a `%` as they are."""
    insert = Statement(
        "INSERT INTO events (resource_version, time, kind, name, uid, type, reason, message)"
        " VALUES (:rv, :time, 'Job', :name, 'u:1', 'Normal', :reason, :message)"
    )
    sizes = [0, 1, 2, 5, 40]
    for size in sizes:
        rows = [
            {"rv": 1, "time": float(i), "name": f"rows-{size}", "reason": f"R{i}", "message": f"it's {i}: 50%"}
            for i in range(size)
        ]
        with store.write() as tx:
            insert.execute_rows(tx.session, rows)
    with store.read() as conn:
        for size in sizes:
            found = eventlog.newest(conn, kind="Job", name=f"rows-{size}")
            assert [(e.reason, e.message, e.uid) for e in found] == [
                (f"R{i}", f"it's {i}: 50%", "u:1") for i in range(size)
            ]


def test_a_queue_row_and_pool_facts_asked_together_are_what_each_read_gives(store):
    """`queued_with_pools` sends both reads before reading either answer (one round trip
    when pipelined); the answers are those of `queued` and `pool_facts`, also for a job
    with no row."""
    with store.write() as tx:
        repo.create(tx, kind="Pool", name="gpu", spec={"slots": 2, "maxBypass": 5}, labels={}, annotations={})
        sched.admit(tx, uid="u1", name="running", pool="gpu", slots=1, node="n1", run_number=1)
        queuing.enqueue(
            tx,
            uid="u2",
            name="waiting",
            pool="gpu",
            slots=1,
            priority=3,
            eligible_at=12.5,
            bypass_count=1,
            node_name=None,
            node_selector={"disk": "ssd"},
            cpu=1.0,
            memory=1 << 20,
        )
    with store.batch(), store.read() as conn:
        found = {uid: sched.queued_with_pools(conn, uid, ["global", "gpu"]) for uid in ("u2", "nobody")}
        for uid, (entry, facts) in found.items():
            assert entry == queuing.queued(conn, uid)
            assert facts == {p: sched.pool_facts(conn, p) for p in ("global", "gpu")}
    assert found["u2"][0] is not None and found["u2"][0].name == "waiting" and found["nobody"][0] is None
    assert found["u2"][1]["gpu"].capacity == 2 and found["u2"][1]["gpu"].used == 1


def test_postgresql_statements_are_prepared_once_and_planned_for_the_tables_as_they_are(pg_url):
    """A statement is parsed by the server once per connection (prepared), and each execution
    is still planned for its values and the tables as they are then. A generic plan made while
    the store was nearly empty read a job by scanning every job (ix_objects_state, 50 ms at
    200,000 jobs, measured) until autovacuum's next ANALYZE; planned each time, it is one
    primary-key lookup."""
    store = Store(pg_url)
    try:
        with store.read() as conn:
            for _ in range(8):  # past the 5 custom plans after which PostgreSQL may keep a generic one
                assert repo.get(conn, kind="Job", name="absent") is None
        with store.write() as tx:
            tx.session.run(
                "INSERT INTO objects (kind, name, uid, generation, resource_version, labels, annotations, spec,"
                " created_at) SELECT 'Job', 'j' || i, 'u' || i, 1, 1, '{}', '{}', '{}', 0"
                " FROM generate_series(1, 20000) AS i"
            )
        with store.read() as conn:
            prepared = conn.run(
                "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'SELECT kind, name, uid, %'"
                " AND statement LIKE '% FROM objects WHERE kind = $1 AND name = $2'"
            ).fetchall()
            assert len(prepared) == 1, prepared  # repo.get's statement, prepared on this reader's connection
            plan = "\n".join(row[0] for row in conn.run(f"EXPLAIN EXECUTE {prepared[0][0]}('Job', 'j5')").fetchall())
            found = repo.get(conn, kind="Job", name="j5")
            assert found is not None and found.uid == "u5"
    finally:
        store.dispose()
    assert "objects_pkey" in plan and "Filter" not in plan, plan


def test_the_placement_key_keeps_a_plan_that_probes_each_job_by_uid_whatever_it_was_planned_on(pg_url):
    """A prepared statement without parameters keeps the plan of its first execution until
    the tables are analyzed again (plan_cache_mode does not reach it). The placement key
    every agent's long poll shares is first run on a nearly empty store; with `kind = 'Job'`
    beside the uid, that plan took the index on kind and filtered every Job by uid once per
    admission (2,200 pages a look in figure 20). The plan the server's connection keeps, read
    once the store has grown, probes the uid's unique index."""
    store = Store(pg_url)
    try:
        with store.read() as conn:
            assert placements.placement_keys(conn) == {}  # planned now, on an empty store
        with store.write() as tx:
            tx.session.run(
                "INSERT INTO objects (kind, name, uid, generation, resource_version, labels, annotations, spec,"
                " created_at) SELECT 'Job', 'j' || i, 'u' || i, 1, 1, '{}', '{}', '{}', 0"
                " FROM generate_series(1, 20000) AS i"
            )
            sched.admit(tx, uid="u5", name="j5", pool=None, slots=1, node="far", run_number=1)
        with store.read() as conn:
            keys = placements.placement_keys(conn)
            prepared = conn.run(
                "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'SELECT a.node, a.job_uid,%'"
            ).fetchall()
            assert len(prepared) == 1, prepared  # on this reader's connection, planned while it was empty
            plan = "\n".join(row[0] for row in conn.run(f"EXPLAIN EXECUTE {prepared[0][0]}").fetchall())
    finally:
        store.dispose()
    assert keys == {"far": [("u5", 1, keys["far"][0][2], 0)]}
    assert "Index Scan using objects_uid_key on objects" in plan, plan
    assert "ix_objects_state" not in plan and "Seq Scan on objects" not in plan, plan


def test_enqueue_gives_its_row_when_asked_and_a_row_already_there_wins(store):
    """`enqueue` sends its insert and reads the answer only when the row is asked for (on
    PostgreSQL in a batch, with whatever is read before); a job already in line keeps its
    row, bypass count and place, and that is the row given."""
    args = dict(pool=None, slots=1, priority=0, node_name=None, node_selector={})
    with store.batch(), store.write(known=True) as tx:
        first = queuing.enqueue(tx, uid="u1", name="a", eligible_at=1.0, bypass_count=2, fresh=True, **args)
        again = queuing.enqueue(tx, uid="u1", name="a", eligible_at=9.0, bypass_count=0, fresh=True, **args)
        other = queuing.enqueue(tx, uid="u2", name="b", eligible_at=5.0, bypass_count=0, fresh=True, **args)
        line = [e.name for e in queuing.in_line(tx.session, None, scope_is_pool=False)]
        assert (first().eligible_at, first().bypass_count) == (1.0, 2)
        assert (again().eligible_at, again().bypass_count) == (1.0, 2)  # the row that was there
        assert other().name == "b"
        assert line == ["a", "b"]
    with store.read() as conn:
        assert queuing.queued(conn, "u1") == first()
