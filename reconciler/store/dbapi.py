"""SQL text on plain DB-API connections: sqlite3 for SQLite, psycopg (v3) for PostgreSQL.

The store's statements are SQL text written once, with named parameters (`:name`), beside
the functions that run them (engine.py, repository.py, scheduling.py). A `Statement`
translates the text to psycopg's parameter style once, runs on the connection of the
caller's transaction, and returns rows as named tuples. No SQLAlchemy on this path: its
import alone cost a CLI read verb half its time, and its execution machinery (about 40 us
a statement) more than SQLite's work on the reconcile loop's point queries (about 5 us).
"""

from __future__ import annotations

import functools
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
    """The rows of one statement (the part of a DB-API cursor the store uses). On a
    pipelined connection the statement may not have been answered yet: fetching its rows
    waits for them, and so does its row count; a failure of any statement sent before it
    is raised here, as a StoreError."""

    __slots__ = ("_conn", "_cursor", "_statement")

    def __init__(self, cursor: Cursor, statement: Statement, conn: Connection):
        self._cursor = cursor
        self._statement = statement
        self._conn = conn

    @property
    def rowcount(self) -> int:
        if self._conn.pipelined and getattr(self._cursor, "pgresult", None) is None:  # not answered yet
            self._conn.sync()
        return self._cursor.rowcount

    def _fetchone(self) -> Sequence[Any] | None:
        try:
            return self._cursor.fetchone()
        except self._conn.errors as exc:
            raise self._conn.failed(exc) from exc

    def first(self) -> Row | None:
        row = self._fetchone()
        return None if row is None else self._statement.row_type(self._conn.dialect, self._cursor)(row)

    def one(self) -> Row:
        row = self.first()
        if row is None:
            raise LookupError("the statement returned no row")
        return row

    def scalar(self) -> Any:
        row = self._fetchone()
        return None if row is None else row[0]

    def all(self) -> list[Row]:
        try:
            rows = self._cursor.fetchall()
        except self._conn.errors as exc:
            raise self._conn.failed(exc) from exc
        if not rows:
            return []
        make = self._statement.row_type(self._conn.dialect, self._cursor)
        return [make(row) for row in rows]

    def tuples(self) -> list[Sequence[Any]]:
        """The rows as both drivers give them (no row factory is set): each a tuple in the
        statement's column order, for many rows read by position without a named row each."""
        try:
            return list(self._cursor.fetchall())
        except self._conn.errors as exc:
            raise self._conn.failed(exc) from exc

    def __iter__(self) -> Iterator[Row]:
        return iter(self.all())


class Connection:
    """One DB-API connection of the store, in the hands of one thread at a time. A
    connection found broken (PostgreSQL) or whose transaction could not be ended is `lost`
    and never used again: the store opens another."""

    __slots__ = ("_pipeline", "dbapi", "dialect", "errors", "is_postgresql", "lost")

    def __init__(self, dbapi: Any, dialect: str, errors: type[Exception]):
        self.dbapi = dbapi  # sqlite3.Connection or psycopg.Connection
        self.dialect = dialect  # "sqlite" | "postgresql"
        self.is_postgresql = dialect == "postgresql"
        self.lost = False
        self.errors = errors  # the driver's base error class
        self._pipeline: tuple[Any, Any] | None = None  # (psycopg's Pipeline, its context) while pipelined

    @property
    def pipelined(self) -> bool:
        return self._pipeline is not None

    def pipeline(self) -> None:
        """From now until the transaction ends, send statements without waiting for their
        answers (PostgreSQL's pipeline mode): a statement whose rows or row count are asked
        for waits for its answer, and those of everything sent before it, in one round trip.
        Not on SQLite (no round trips), nor where libpq cannot."""
        if not self.is_postgresql or self._pipeline is not None or not _pipeline_supported():
            return
        context = self.dbapi.pipeline()
        self._pipeline = (context.__enter__(), context)

    def sync(self) -> None:
        """Wait for the answers of every pipelined statement sent so far."""
        assert self._pipeline is not None, "sync outside pipeline mode"
        try:
            self._pipeline[0].sync()
        except self.errors as exc:
            raise self.failed(exc) from exc

    def _unpipeline(self) -> None:
        """Leave pipeline mode, once every statement is answered; a statement that failed
        raises the driver's error."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline[1].__exit__(None, None, None)

    def run(self, sql: str, params: Mapping[str, Any] | Sequence[Any] | None = None) -> Cursor:
        """Text in this driver's parameter style; `Statement.execute` is what the store calls.
        On PostgreSQL a statement with parameters is prepared on the server at its first use
        (connect.py); text without them may be several statements, which cannot be."""
        try:
            if params is not None:
                cursor: Cursor = self.dbapi.execute(sql, params)
            elif self.is_postgresql:
                cursor = self.dbapi.execute(sql, prepare=False)
            else:
                cursor = self.dbapi.execute(sql)
        except self.errors as exc:
            raise self.failed(exc) from exc
        return cursor

    def run_many(self, sql: str, rows: Iterable[Mapping[str, Any]] | Iterable[Sequence[Any]]) -> None:
        try:
            self.dbapi.cursor().executemany(sql, rows)
        except self.errors as exc:
            raise self.failed(exc) from exc

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
        except self.errors as exc:
            raise self.failed(exc) from exc

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
        in one round trip (an explicit PostgreSQL transaction only). Pipelined, the COMMIT
        follows the statements not answered yet in that round trip: if one of them failed, the
        server skips the rest, the failure is raised, and nothing is committed."""
        if self.lost:
            return  # its transaction went with it
        try:
            if commit and self._pipeline is not None and self.explicit:
                for statement in (before, "COMMIT"):
                    if statement is not None:
                        self.dbapi.execute(statement, prepare=False)
                self._unpipeline()
                return
            self._unpipeline()  # a pipelined statement that failed fails the commit
            if self.is_postgresql and self.explicit:
                end = "COMMIT" if commit else "ROLLBACK"
                self.dbapi.execute(f"{before}; {end}" if before and commit else end, prepare=False)
            else:
                assert before is None, "a statement sent with COMMIT needs an explicit transaction"
                self.dbapi.commit() if commit else self.dbapi.rollback()
        except self.errors as exc:
            self.close()  # a transaction that could not be ended must not stay open on it
            raise self.failed(exc) from exc

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
        self._pipeline = None  # it goes with the connection
        with suppress(Exception):  # already broken, or closed by another thread
            self.dbapi.close()

    def failed(self, exc: Exception) -> StoreError:
        """The driver's error as the store's."""
        if self.is_postgresql and self.dbapi.closed:
            self.lost = True  # the server connection is gone: the store must not reuse it
        return StoreError(str(exc))


@functools.cache
def _pipeline_supported() -> bool:
    """Whether psycopg's libpq has pipeline mode (14 and later)."""
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


# `:name` outside string literals and `::` casts becomes psycopg's `%(name)s`; every `%`
# (LIKE patterns included) is doubled, as psycopg reads `%` anywhere in the text.
_TOKENS = re.compile(r"'(?:[^']|'')*'|(?<![:\w]):([A-Za-z_]\w*)|%")


def _pyformat(match: re.Match[str]) -> str:
    token = match.group(0)
    if token.startswith("'"):
        return token.replace("%", "%%")
    return "%%" if token == "%" else f"%({match.group(1)})s"


def _positional(sql: str, mark: str, percent: str) -> str:
    """The text with each `:name` as `mark`; every name must come once."""
    names = [m.group(1) for m in _TOKENS.finditer(sql) if m.group(1)]
    if len(set(names)) != len(names):
        raise ValueError(f"a parameter named twice cannot be given by position: {sql}")

    def spelled(match: re.Match[str]) -> str:
        token = match.group(0)
        if token.startswith("'"):
            return token.replace("%", percent)
        return percent if token == "%" else mark

    return _TOKENS.sub(spelled, sql)


class Statement:
    """SQL text with `:name` parameters, in both drivers' styles (translated once), run on
    the connection of the caller's transaction. Rows come back as named tuples."""

    __slots__ = ("_by_position", "_rows", "postgresql", "sqlite")

    def __init__(self, sql: str):
        self.sqlite = sql  # sqlite3 takes `:name` as it is
        self.postgresql = _TOKENS.sub(_pyformat, sql)
        self._rows: dict[str, Callable[[Sequence[Any]], Row]] = {}  # dialect -> its row type
        self._by_position: tuple[str, str] | None = None  # (sqlite, postgresql): made at first use

    def text(self, conn: Connection) -> str:
        return self.postgresql if conn.is_postgresql else self.sqlite

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Result:
        # psycopg reads `%%` only when given parameters: always give it some
        return Result(conn.run(self.text(conn), params or _NO_PARAMS), self, conn)

    def row_type(self, dialect: str, cursor: Cursor) -> Callable[[Sequence[Any]], Row]:
        """What makes this statement's rows named tuples: built from the first answer that
        has rows (a pipelined statement's columns are known only once it is answered)."""
        make = self._rows.get(dialect)
        if make is None:
            columns = [d[0] for d in cursor.description or ()]
            row_type: Any = namedtuple("Row", columns, rename=True)  # type: ignore[misc]  # columns known at run time
            make = self._rows[dialect] = row_type._make
        return make

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

    def execute_values(self, conn: Connection, rows: Sequence[Sequence[Any]]) -> None:
        """`execute_rows` for rows given as tuples of their parameters' values, in the order
        the text names them: sqlite3 binds a tuple by position at half the cost of a mapping
        by name (1.9 us against 3.4 a row of 16), which the inserts of a Source's batch of
        thousands of jobs, and their events, pay for each row."""
        if self._by_position is None:
            self._by_position = (_positional(self.sqlite, "?", "%"), _positional(self.sqlite, "%s", "%%"))
        text = self._by_position[1] if conn.is_postgresql else self._by_position[0]
        if len(rows) == 1:
            conn.run(text, rows[0])
        elif rows:
            conn.run_many(text, rows)

    def __repr__(self) -> str:
        return f"Statement({self.sqlite!r})"
