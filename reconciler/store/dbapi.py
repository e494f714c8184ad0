"""SQL text on plain DB-API connections: sqlite3 for SQLite, psycopg (v3) for PostgreSQL.

The store's statements are SQL text written once, with named parameters (`:name`), beside
the functions that run them (engine.py, repository.py, scheduling.py). A `Statement`
translates the text to psycopg's parameter style once, runs on the connection of the
caller's transaction, and returns rows as named tuples. No SQLAlchemy on this path: its
import alone cost a CLI read verb half its time, and its execution machinery (about 40 us
a statement) more than SQLite's work on the reconcile loop's point queries (about 5 us).
"""

from __future__ import annotations

import re
import select
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from typing import Any, Protocol

Row = Any  # a named tuple whose fields are the statement's columns
_NO_PARAMS: Mapping[str, Any] = {}


class StoreError(Exception):
    """A database failure: the store cannot be reached or refused a statement. The driver's
    error (sqlite3 or psycopg) is the __cause__; its message is this one's."""


class Cursor(Protocol):
    @property
    def description(self) -> Sequence[Sequence[Any]] | None: ...
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Sequence[Any] | None: ...
    def fetchall(self) -> Sequence[Sequence[Any]]: ...
    def executemany(self, sql: str, rows: Iterable[Mapping[str, Any]], /) -> object: ...
    def nextset(self) -> bool | None: ...


class Result:
    """The rows of one statement (the part of a DB-API cursor the store uses)."""

    __slots__ = ("_cursor", "_make")

    def __init__(self, cursor: Cursor, make: Callable[[Sequence[Any]], Row]):
        self._cursor = cursor
        self._make = make

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def first(self) -> Row | None:
        row = self._cursor.fetchone()
        return None if row is None else self._make(row)

    def one(self) -> Row:
        row = self.first()
        if row is None:
            raise LookupError("the statement returned no row")
        return row

    def scalar(self) -> Any:
        row = self._cursor.fetchone()
        return None if row is None else row[0]

    def all(self) -> list[Row]:
        return [self._make(row) for row in self._cursor.fetchall()]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.all())


class Connection:
    """One DB-API connection of the store, in the hands of one thread at a time. A
    connection found broken (PostgreSQL) or whose transaction could not be ended is `lost`
    and never used again: the store opens another."""

    __slots__ = ("_errors", "dbapi", "dialect", "is_postgresql", "lost")

    def __init__(self, dbapi: Any, dialect: str, errors: type[Exception]):
        self.dbapi = dbapi  # sqlite3.Connection or psycopg.Connection
        self.dialect = dialect  # "sqlite" | "postgresql"
        self.is_postgresql = dialect == "postgresql"
        self.lost = False
        self._errors = errors  # the driver's base error class

    def run(self, sql: str, params: Mapping[str, Any] | None = None) -> Cursor:
        """Text in this driver's parameter style; `Statement.execute` is what the store calls."""
        try:
            cursor: Cursor = self.dbapi.execute(sql) if params is None else self.dbapi.execute(sql, params)
        except self._errors as exc:
            raise self._failed(exc) from exc
        return cursor

    def run_many(self, sql: str, rows: Iterable[Mapping[str, Any]]) -> None:
        try:
            self.dbapi.cursor().executemany(sql, rows)
        except self._errors as exc:
            raise self._failed(exc) from exc

    @property
    def explicit(self) -> bool:
        """Whether BEGIN and COMMIT are ours: sqlite3 in autocommit mode (isolation_level
        None), and the PostgreSQL writer's connection (autocommit at the driver); psycopg
        begins a reader's transactions with their first statement."""
        return not self.is_postgresql or bool(self.dbapi.autocommit)

    def run_each(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """The statement once per row, and the rows each changed. On PostgreSQL in one round
        trip (psycopg's executemany in pipeline mode, a result per row)."""
        try:
            if not self.is_postgresql:
                return [self.dbapi.execute(sql, row).rowcount for row in rows]
            cursor = self.dbapi.cursor()
            cursor.executemany(sql, rows, returning=True)
            counts = [cursor.rowcount]
            while cursor.nextset():
                counts.append(cursor.rowcount)
            return counts
        except self._errors as exc:
            raise self._failed(exc) from exc

    def begin(self, sqlite_begin: str) -> None:
        if not self.is_postgresql:
            self.run(sqlite_begin)
        elif self.explicit:
            self.run("BEGIN")

    def script(self, sql: str) -> Cursor:
        """Statements without parameters, `;`-separated, in one round trip (PostgreSQL's simple
        query protocol); the cursor holds the last one's rows."""
        cursor = self.run(sql)
        while cursor.nextset():
            pass
        return cursor

    def end(self, *, commit: bool, before: str | None = None) -> None:
        """Commit or roll back. `before`: a statement without parameters sent with the COMMIT
        in one round trip (an explicit PostgreSQL transaction only)."""
        if self.lost:
            return  # its transaction went with it
        try:
            if self.is_postgresql and self.explicit:
                end = "COMMIT" if commit else "ROLLBACK"
                self.dbapi.execute(f"{before}; {end}" if before and commit else end)
            else:
                assert before is None, "a statement sent with COMMIT needs an explicit transaction"
                self.dbapi.commit() if commit else self.dbapi.rollback()
        except self._errors as exc:
            self.close()  # a transaction that could not be ended must not stay open on it
            raise self._failed(exc) from exc

    def usable(self) -> bool:
        if self.lost:
            return False
        if not self.is_postgresql:
            return True
        if self.dbapi.closed:
            return False
        # Between transactions the server has nothing to say: a readable socket means it
        # ended the session (a restart, pg_terminate_backend). One poll, no round trip.
        readable, _, _ = select.select([self.dbapi.fileno()], [], [], 0)
        return not readable

    def close(self) -> None:
        self.lost = True
        with suppress(Exception):  # already broken, or closed by another thread
            self.dbapi.close()

    def _failed(self, exc: Exception) -> StoreError:
        if self.is_postgresql and self.dbapi.closed:
            self.lost = True  # the server connection is gone: the store must not reuse it
        return StoreError(str(exc))


# `:name` outside string literals and `::` casts becomes psycopg's `%(name)s`; every `%`
# (LIKE patterns included) is doubled, as psycopg reads `%` anywhere in the text.
_TOKENS = re.compile(r"'(?:[^']|'')*'|(?<![:\w]):([A-Za-z_]\w*)|%")


def _pyformat(match: re.Match[str]) -> str:
    token = match.group(0)
    if token.startswith("'"):
        return token.replace("%", "%%")
    return "%%" if token == "%" else f"%({match.group(1)})s"


class Statement:
    """SQL text with `:name` parameters, in both drivers' styles (translated once), run on
    the connection of the caller's transaction. Rows come back as named tuples."""

    __slots__ = ("_rows", "postgresql", "sqlite")

    def __init__(self, sql: str):
        self.sqlite = sql  # sqlite3 takes `:name` as it is
        self.postgresql = _TOKENS.sub(_pyformat, sql)
        self._rows: dict[str, Callable[[Sequence[Any]], Row]] = {}  # dialect -> its row type

    def text(self, conn: Connection) -> str:
        return self.postgresql if conn.is_postgresql else self.sqlite

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Result:
        # psycopg reads `%%` only when given parameters: always give it some
        cursor = conn.run(self.text(conn), params or _NO_PARAMS)
        make = self._rows.get(conn.dialect)
        if make is None:
            columns = [d[0] for d in cursor.description or ()]
            row_type: Any = namedtuple("Row", columns, rename=True)  # type: ignore[misc]  # columns known at run time
            make = self._rows[conn.dialect] = row_type._make
        return Result(cursor, make)

    def execute_many(self, conn: Connection, rows: Iterable[Mapping[str, Any]]) -> None:
        conn.run_many(self.text(conn), rows)

    def execute_each(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Once per row (on PostgreSQL pipelined: one round trip); the rows each changed."""
        if not rows:
            return []
        if len(rows) == 1:
            return [self.execute(conn, rows[0]).rowcount]
        return conn.run_each(self.text(conn), rows)

    def execute_rows(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Once per row: a single row as a plain execute (executemany's set-up costs more
        than the statement on the reconcile loop's writes), none as nothing."""
        if len(rows) == 1:
            self.execute(conn, rows[0])
        elif rows:
            self.execute_many(conn, rows)

    def __repr__(self) -> str:
        return f"Statement({self.sqlite!r})"
