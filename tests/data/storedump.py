"""Every row of every table of a store, read directly with SQLAlchemy (SQLite or PostgreSQL),
for asserting that an operation left a store exactly as it was."""

from __future__ import annotations

from typing import Any


def dump_store(url: str) -> dict[str, list[tuple[Any, ...]]]:
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.pool import NullPool

    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            tables = sorted(inspect(conn).get_table_names())
            assert {"objects", "events", "meta"} <= set(tables), tables
            return {t: sorted((tuple(r) for r in conn.execute(text(f'SELECT * FROM "{t}"'))), key=repr) for t in tables}
    finally:
        engine.dispose()
