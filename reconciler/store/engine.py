"""The one place that owns database engines: SQLite (embedded default) or PostgreSQL.

Write transactions are serialized store-wide (SQLite `BEGIN IMMEDIATE`; PostgreSQL a row
lock on the change sequence), which makes every compare-and-swap and every admission
decision a plain read-then-write without lost updates."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from .migrations import current_version, migrate
from .prepared import Prepared

BUSY_TIMEOUT_MS = 30_000
CREATE_ATTEMPTS = 20  # opening a new store while another process creates it: ~8 s at most


def state_home() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "reconciler"


def default_store_url() -> str:
    return os.environ.get("RECONCILER_STORE") or f"sqlite:///{state_home() / 'state.db'}"


def _owner_only_file(path: Path) -> None:
    """Create the database folder 0700 and file 0600 before SQLite opens it (its -wal and
    -shm files copy the file's mode).

    An existing file is never opened here: closing any descriptor of a file drops every
    POSIX lock this process holds on it, SQLite's included. A second Store on the same
    file in one process (controller --watch has two) would then leave the first one's
    connections unlocked; another process closing its last connection would take itself
    for the last one, checkpoint and delete the -wal file, and the first Store would go on
    committing into an unlinked WAL that nobody else can see."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        return
    os.close(fd)


_NEXT_RV = Prepared(text("UPDATE meta SET value = value + 1 WHERE key = 'seq' RETURNING value"))
_SEQ = Prepared(text("SELECT value FROM meta WHERE key = 'seq'"))
_LOCK_SEQ = Prepared(text("SELECT value FROM meta WHERE key = 'seq' FOR UPDATE"))
_NOTIFY = Prepared(text("SELECT pg_notify('reconciler', :rv)"))


class Tx:
    """One write transaction; `rv()` allocates its resourceVersion once, on first use.
    `session` is a SQLAlchemy Connection: Core statements only, no ORM unit of work, which
    halves the cost of the reconcile loop's small transactions."""

    def __init__(self, session: Connection, store: Store):
        self.session = session
        self.store = store
        self._rv: int | None = None
        self.discarded = False

    def discard(self) -> None:
        """Roll back instead of committing (dry runs)."""
        self.discarded = True

    def rv(self) -> int:
        if self._rv is None:
            self._rv = int(_NEXT_RV.execute(self.session).scalar())
        return self._rv

    @property
    def changed(self) -> bool:
        return self._rv is not None


class Store:
    def __init__(self, url: str | None = None):
        self.url = url or default_store_url()
        self.is_sqlite = self.url.startswith("sqlite")
        self.own_writes: set[int] = set()  # resourceVersions this process wrote: watchers skip them
        # Writers of this process queue here rather than in SQLite's busy handler, which
        # sleeps in steps of up to 25 ms and turns contention between threads into latency.
        self._writer = threading.Lock()
        # Connections are kept, one per reading thread and one for the writer: a pool
        # checkout and return per transaction cost more than the reconcile loop's queries.
        self._local = threading.local()
        self._write_conn: Connection | None = None
        self._kept: list[Connection] = []
        self._kept_lock = threading.Lock()
        if self.is_sqlite:
            self.path = Path(self.url.split("///", 1)[1]) if "///" in self.url else None
            if self.path is not None:
                _owner_only_file(self.path)
            self._read = self._sqlite_engine(write=False)
            self._write = self._sqlite_engine(write=True)
        elif self.url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            self.path = None
            pg_url = "postgresql+psycopg://" + self.url.split("://", 1)[1]
            # No pre-ping (a round trip per checkout). No server-side prepared statements: a plan
            # cached while the queue was short (a sort of the whole table) outlives its growth.
            self._read = self._write = create_engine(pg_url, pool_size=5, connect_args={"prepare_threshold": None})
        else:
            raise ValueError(f"unsupported store URL {self.url!r}: use sqlite:///PATH or postgresql://...")
        self._migrate()

    def _sqlite_engine(self, *, write: bool) -> Engine:
        engine = create_engine(self.url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):  # pragma: no branch - trivial
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        begin = "BEGIN IMMEDIATE" if write else "BEGIN"

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            dbapi = conn.connection.dbapi_connection
            if not dbapi.in_transaction:  # Store.read/write may have begun it already
                dbapi.execute(begin)

        return engine

    @property
    def state_dir(self) -> Path:
        """Where run logs and exit files live: beside a SQLite file, else the user's state dir."""
        return self.path.parent if self.path is not None else state_home()

    def _migrate(self) -> None:
        for attempt in range(CREATE_ATTEMPTS):
            try:
                with self._write.begin() as conn:
                    if not self.is_sqlite:
                        # one migrator at a time across processes
                        conn.execute(text("SELECT pg_advisory_xact_lock(727274)"))
                    migrate(conn, current_version(conn))
                return
            except OperationalError as exc:
                # Two processes opening a new SQLite store at once (`controller` and `apply`
                # started together): switching the new file to WAL takes an exclusive lock,
                # and SQLite answers the deadlock between two such switches with an immediate
                # "database is locked" to one of them, not a wait. That one tries again.
                if not self.is_sqlite or "locked" not in str(exc) or attempt == CREATE_ATTEMPTS - 1:
                    raise
                time.sleep(min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.0))

    def _keep(self, engine: Engine) -> Connection:
        conn = engine.connect()
        with self._kept_lock:
            self._kept = [c for c in self._kept if not c.closed]
            self._kept.append(conn)
        return conn

    @staticmethod
    def _usable(conn: Connection | None) -> bool:
        return conn is not None and not conn.closed and not conn.invalidated

    # Transactions on the kept connections are begun and ended on the DB-API connection
    # itself: SQLAlchemy's transaction objects and events cost more than a point query. If a
    # Core statement inside makes SQLAlchemy begin one too, it is ended through SQLAlchemy.
    def _begin(self, conn: Connection, sqlite_begin: str):
        dbapi = conn.connection.dbapi_connection
        if self.is_sqlite:
            dbapi.execute(sqlite_begin)  # PostgreSQL (psycopg) begins with the first statement
        return dbapi

    @staticmethod
    def _end(conn: Connection, dbapi, *, commit: bool) -> None:
        if conn.invalidated:
            return  # the connection was lost (its transaction with it); the next use reconnects
        if conn.in_transaction():
            conn.commit() if commit else conn.rollback()
        elif commit:
            dbapi.commit()
        else:
            dbapi.rollback()

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction: one consistent snapshot for all its statements (SQLite's
        WAL read transaction; PostgreSQL's REPEATABLE READ, READ ONLY on this thread's kept
        connection, where the default READ COMMITTED would give each statement its own)."""
        if getattr(self._local, "reading", False):  # a read inside a read on this thread
            with self._read.connect() as other, other.begin():
                yield other
            return
        conn = getattr(self._local, "conn", None)
        if not self._usable(conn):
            conn = self._local.conn = self._keep(self._read)
            if not self.is_sqlite:  # psycopg opens each transaction with these: no extra round trip
                import psycopg

                pg = conn.connection.dbapi_connection
                pg.isolation_level, pg.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
        self._local.reading = True
        try:
            dbapi = self._begin(conn, "BEGIN")
            done = False
            try:
                yield conn
                done = True
            finally:
                self._end(conn, dbapi, commit=done)
        finally:
            self._local.reading = False

    def _writer_connection(self) -> Connection:
        if not self._usable(self._write_conn):
            self._write_conn = self._keep(self._write)
        return self._write_conn

    @contextmanager
    def write(self) -> Iterator[Tx]:
        with self._writer:
            conn = self._writer_connection()
            dbapi = self._begin(conn, "BEGIN IMMEDIATE")
            commit = False
            try:
                if not self.is_sqlite:
                    _LOCK_SEQ.execute(conn)
                tx = Tx(conn, self)
                yield tx
                if tx.changed and not tx.discarded and not self.is_sqlite:
                    _NOTIFY.execute(conn, {"rv": str(tx.rv())})
                commit = not tx.discarded
            finally:
                self._end(conn, dbapi, commit=commit)
            if commit and tx.changed:
                self.own_writes.add(tx.rv())

    def change_seq(self) -> int:
        """The cheap "did anything change" probe other processes poll."""
        with self.read() as conn:
            return int(_SEQ.execute(conn).scalar())

    def dispose(self) -> None:
        with self._kept_lock:
            kept, self._kept = self._kept, []
        for conn in kept:
            try:
                conn.close()
            except Exception:  # a connection another thread still uses, or already broken
                pass
        self._write_conn = None
        self._local = threading.local()
        self._read.dispose()
        if self._write is not self._read:
            self._write.dispose()
