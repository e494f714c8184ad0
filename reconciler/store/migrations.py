"""Schema versions. Each migration runs once, in order, inside one write transaction.

SQLModel's tables (tables.py) are the schema: SQLAlchemy compiles their DDL for the store's
dialect and it runs on the store's own connection. This module is imported only when a
store is new or older than this reconciler (engine.Store._upgrade), so opening a current
store never imports SQLAlchemy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import create_mock_engine
from sqlmodel import SQLModel

from ..errors import ReconcilerError
from .dbapi import Connection, Statement
from .engine import META, SCHEMA_VERSION
from .tables import SCHEMA_TABLES  # importing tables registers them on SQLModel.metadata

_DIALECT_URLS = {"sqlite": "sqlite://", "postgresql": "postgresql+psycopg://"}
_HAS_META = {
    "sqlite": Statement("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'"),
    "postgresql": Statement(
        "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = 'meta'"
    ),
}
_SET_META = Statement("UPDATE meta SET value = :value WHERE key = :key")
_ADD_META = Statement("INSERT INTO meta (key, value) VALUES (:key, :value)")
_ONE_MIGRATOR = Statement("SELECT pg_advisory_xact_lock(727274)")  # PostgreSQL: one at a time across processes


def _create(conn: Connection, names: list[str]) -> None:
    """The statements create_all would send for these tables, run in this transaction (no
    existence checks: the version says they are not there)."""

    def run(ddl: Any, *_: Any, **__: Any) -> None:
        conn.run(str(ddl.compile(dialect=engine.dialect)))

    engine = create_mock_engine(_DIALECT_URLS[conn.dialect], run)
    tables = [SQLModel.metadata.tables[name] for name in names]
    SQLModel.metadata.create_all(engine, tables=tables, checkfirst=False)


def _v1(conn: Connection) -> None:
    _create(conn, SCHEMA_TABLES[0])


def _v2(conn: Connection) -> None:
    """Notifier delivery: the outbox and each notifier's delivery counts."""
    _create(conn, SCHEMA_TABLES[1])


MIGRATIONS: list[Callable[[Connection], None]] = [_v1, _v2]
assert len(MIGRATIONS) == SCHEMA_VERSION, "engine.SCHEMA_VERSION counts the migrations"


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
    for version in range(found + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version - 1](conn)
    if found == 0:
        _ADD_META.execute_many(conn, [{"key": "schema", "value": SCHEMA_VERSION}, {"key": "seq", "value": 0}])
    elif found < SCHEMA_VERSION:
        _SET_META.execute(conn, {"key": "schema", "value": SCHEMA_VERSION})
