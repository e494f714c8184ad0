"""Schema versions. Each migration runs once, in order, inside one write transaction.

SQLModel's tables (tables.py) are the schema. What creates them is their DDL for the store's
dialect, compiled ahead into ddl.py (ddlgen.py; a test holds the two equal), which runs on the
store's own connection: creating a store imports no SQLAlchemy or SQLModel, whose import was
about half of `up`'s fixed cost on a fresh store. This module is imported only when a store
is new or older than this reconciler (engine.Store._upgrade)."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ReconcilerError
from .dbapi import Connection, Statement
from .ddl import DDL
from .engine import SCHEMA_VERSION
from .transactions import META

_HAS_META = {
    "sqlite": Statement("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'"),
    "postgresql": Statement(
        "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = 'meta'"
    ),
}
_SET_META = Statement("UPDATE meta SET value = :value WHERE key = :key")
_ADD_META = Statement("INSERT INTO meta (key, value) VALUES (:key, :value)")
_ONE_MIGRATOR = Statement("SELECT pg_advisory_xact_lock(727274)")  # PostgreSQL: one at a time across processes


def _create(conn: Connection, names: list[str] | None = None) -> None:
    """The statements create_all would send for these tables (all: a new store), run in this
    transaction (no existence checks: the version says they are not there)."""
    per_table = DDL[conn.dialect]
    for name in per_table if names is None else names:
        for sql in per_table[name]:
            conn.run(sql)


def _v2(conn: Connection) -> None:
    """Notifier delivery (the outbox and each notifier's delivery counts), and admissions
    that hold a service's port on its node, one service per port and node."""
    _create(conn, ["outbox", "deliveries"])
    conn.run("ALTER TABLE admissions ADD COLUMN port INTEGER")
    conn.run("CREATE UNIQUE INDEX ix_admissions_node_port ON admissions (node, port) WHERE port IS NOT NULL")


# UPGRADES[n - 2] brings a store at version n - 1 to version n; a new store is created at
# the current version at once. Each must leave the schema exactly as `_create` makes it.
_JSON_FIELD = {  # a top-level string of a JSON text column, per dialect
    "sqlite": "json_extract({column}, '$.{field}')",
    "postgresql": "({column}::json ->> '{field}')",
}


def _v3(conn: Connection) -> None:
    """Objects copy status.outcome, status.reason and a job's spec.pool into columns, with
    an index the metrics count by. Existing rows are filled from their JSON."""
    for column in ("outcome", "reason", "pool"):
        conn.run(f"ALTER TABLE objects ADD COLUMN {column} VARCHAR")
    field = _JSON_FIELD[conn.dialect]
    outcome, reason = field.format(column="status", field="outcome"), field.format(column="status", field="reason")
    pool = field.format(column="spec", field="pool")
    conn.run(f"UPDATE objects SET outcome = {outcome}, reason = {reason} WHERE status IS NOT NULL")
    conn.run(f"UPDATE objects SET pool = {pool} WHERE kind = 'Job'")
    conn.run("CREATE INDEX ix_objects_state ON objects (kind, phase, outcome, pool, reason)")


def _v4(conn: Connection) -> None:
    """Source ingestion: the messages each Source turned into jobs, for redeliveries."""
    _create(conn, ["ingested"])


def _v5(conn: Connection) -> None:
    """The leader lease of `serve` processes sharing a store."""
    _create(conn, ["leases"])


def _v6(conn: Connection) -> None:
    """Admissions and queue rows carry the job's cpu and memory, which nodes that declare
    them count. Rows from before hold NULL: admitted uncounted, they count as nothing."""
    for table in ("admissions", "queue"):
        conn.run(f"ALTER TABLE {table} ADD COLUMN cpu FLOAT")
        conn.run(f"ALTER TABLE {table} ADD COLUMN memory BIGINT")


def _v7(conn: Connection) -> None:
    """Admissions carry an epoch (fencing remote agents' reports) and the agent's last report
    of their run. An admission from before has no epoch: no agent can report on it (a
    local run is watched by its controller), which is what it always was."""
    conn.run("ALTER TABLE admissions ADD COLUMN epoch INTEGER")
    conn.run("ALTER TABLE admissions ADD COLUMN report TEXT")
    conn.run("ALTER TABLE admissions ADD COLUMN reported_rv INTEGER")


def _v8(conn: Connection) -> None:
    """No index on objects.phase alone: every query by phase names the kind, which
    ix_objects_state leads with, and each status write that changes the phase (and each
    object stored) paid for updating both."""
    conn.run("DROP INDEX ix_objects_phase")


def _v9(conn: Connection) -> None:
    """Objects record the resourceVersion that created them (a watch classifies a change by
    it). Objects from before have none: they read as created at 0, before any watch."""
    conn.run("ALTER TABLE objects ADD COLUMN created_rv INTEGER")


UPGRADES: list[Callable[[Connection], None]] = [_v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9]
assert len(UPGRADES) + 1 == SCHEMA_VERSION, "engine.SCHEMA_VERSION is 1 + the number of upgrades"


def current_version(conn: Connection) -> int:
    if not _HAS_META[conn.dialect].execute(conn).scalar():
        return 0
    found = META.execute(conn, {"key": "schema"}).scalar()
    return 0 if found is None else int(found)


def migrate(conn: Connection) -> None:
    """Bring the store to SCHEMA_VERSION inside the caller's write transaction; refuses a
    store from the future."""
    if conn.is_postgresql:
        _ONE_MIGRATOR.execute(conn)
    found = current_version(conn)
    if found > SCHEMA_VERSION:
        raise ReconcilerError(
            f"store schema {found} is newer than this reconciler ({SCHEMA_VERSION}); "
            "upgrade reconciler to use this store"
        )
    if found == 0:
        _create(conn)
    else:
        for version in range(found + 1, SCHEMA_VERSION + 1):
            UPGRADES[version - 2](conn)
    if found == 0:
        _ADD_META.execute_many(conn, [{"key": "schema", "value": SCHEMA_VERSION}, {"key": "seq", "value": 0}])
    elif found < SCHEMA_VERSION:
        _SET_META.execute(conn, {"key": "schema", "value": SCHEMA_VERSION})
