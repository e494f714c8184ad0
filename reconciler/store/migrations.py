"""Schema versions. Each migration runs once, in order, inside one write transaction."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, inspect, text
from sqlmodel import SQLModel

from ..errors import ReconcilerError
from . import tables  # noqa: F401  (registers the tables on SQLModel.metadata)


def _v1(conn: Connection) -> None:
    SQLModel.metadata.create_all(conn)


MIGRATIONS: list[Callable[[Connection], None]] = [_v1]
SCHEMA_VERSION = len(MIGRATIONS)


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table("meta"):
        return 0
    row = conn.execute(text("SELECT value FROM meta WHERE key = 'schema'")).first()
    return int(row[0]) if row else 0


def migrate(conn: Connection, found: int) -> None:
    """Bring a store from version `found` to SCHEMA_VERSION; refuses a store from the future."""
    if found > SCHEMA_VERSION:
        raise ReconcilerError(
            f"store schema {found} is newer than this reconciler ({SCHEMA_VERSION}); "
            "upgrade reconciler to use this store"
        )
    for version in range(found + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version - 1](conn)
    if found == 0:
        conn.execute(text("INSERT INTO meta (key, value) VALUES ('schema', :v), ('seq', 0)"), {"v": SCHEMA_VERSION})
    elif found < SCHEMA_VERSION:
        conn.execute(text("UPDATE meta SET value = :v WHERE key = 'schema'"), {"v": SCHEMA_VERSION})
