"""Statements of the reconcile loop, compiled once per dialect and run on the DB-API cursor.

SQLAlchemy's execution path (compiled-cache lookup, execution context, result metadata,
events) costs about 40 us per statement; SQLite answers these point queries in about 5 us,
and a job takes some fifty of them. A `Prepared` keeps the Core statement as the one
definition of the SQL and skips that machinery: the text and the order of its parameters
are computed once per dialect, rows come back as named tuples, and the statement runs in
the caller's transaction on the same connection.

Only plain statements qualify: no expanding IN lists, no type processing of values (the
tables hold text, integers and floats only)."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import ClauseElement


class Result:
    """The part of SQLAlchemy's Result the store uses."""

    __slots__ = ("_cursor", "_make")

    def __init__(self, cursor, make):
        self._cursor = cursor
        self._make = make

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def first(self):
        row = self._cursor.fetchone()
        return None if row is None else self._make(row)

    def one(self):
        row = self.first()
        if row is None:
            raise LookupError("the statement returned no row")
        return row

    def scalar(self) -> Any:
        row = self._cursor.fetchone()
        return None if row is None else row[0]

    def all(self) -> list:
        return [self._make(row) for row in self._cursor.fetchall()]


class Prepared:
    def __init__(self, statement: ClauseElement):
        self.statement = statement
        self._by_dialect: dict[str, tuple[str, Sequence[str] | None, dict[str, Any], frozenset[str]]] = {}
        self._rows: dict[tuple, Any] = {}  # column names -> their named-tuple type

    def _compiled(self, dialect):
        found = self._by_dialect.get(dialect.name)
        if found is None:
            compiled = self.statement.compile(dialect=dialect)
            positions = tuple(compiled.positiontup) if compiled.positional else None
            names = compiled.bind_names  # bind parameter -> its name in the SQL text
            defaults = {names[b]: b.effective_value for b in names if not b.required}
            required = frozenset(names[b] for b in names if b.required)
            found = self._by_dialect[dialect.name] = (compiled.string, positions, defaults, required)
        return found

    def _args(self, dialect, params: dict[str, Any] | None):
        sql, positions, defaults, required = self._compiled(dialect)
        if params is None:
            params = {}
        if not required <= params.keys():
            raise KeyError(f"missing parameters {sorted(required - params.keys())} for {sql!r}")
        values = {**defaults, **params}
        return sql, ([values[name] for name in positions] if positions is not None else values)

    def _row_type(self, description):
        names = tuple(d[0] for d in description) if description else ()
        make = self._rows.get(names)
        if make is None:
            make = self._rows[names] = namedtuple("Row", names, rename=True)._make
        return make

    def execute(self, session: Connection, params: dict[str, Any] | None = None) -> Result:
        sql, args = self._args(session.dialect, params)
        return self._run(session, lambda cursor: cursor.execute(sql, args))

    def execute_many(self, session: Connection, rows: Iterable[dict[str, Any]]) -> None:
        sql = self._compiled(session.dialect)[0]
        batch = [self._args(session.dialect, row)[1] for row in rows]
        self._run(session, lambda cursor: cursor.executemany(sql, batch))

    def _run(self, session: Connection, call) -> Result:
        dbapi = session.connection.dbapi_connection
        cursor = dbapi.cursor()
        try:
            call(cursor)
        except Exception as exc:
            # what SQLAlchemy would do: a lost server connection is not reused
            if session.dialect.is_disconnect(exc, dbapi, cursor):
                session.invalidate(exc)
            raise
        return Result(cursor, self._row_type(cursor.description))
