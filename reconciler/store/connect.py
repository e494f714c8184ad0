"""Opening a store's connections: the URL forms accepted and where the default store lives,
a SQLite file made private before SQLite opens it and its connection settings, a PostgreSQL
connection. `engine.Store` owns the connections these make."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

from ..errors import InvalidInput
from ..files import make_private_dirs
from .dbapi import Connection, StoreError

BUSY_TIMEOUT_MS = 30_000
_SQLITE_SETUP = (
    "PRAGMA journal_mode=WAL",
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys=ON",
    "PRAGMA synchronous=NORMAL",
)


def state_home() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "reconciler"


def default_store_url() -> str:
    return os.environ.get("RECONCILER_STORE") or f"sqlite:///{state_home() / 'state.db'}"


ACCEPTED_URLS = "sqlite:///PATH (a SQLite file) or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
_SQLITE_URL = "sqlite:///"
_POSTGRESQL_URLS = ("postgresql://", "postgres://", "postgresql+psycopg://")
_PASSWORD = re.compile(r"(?<=://)([^:/@]*):[^/\s]*@")  # to the last @: a password may hold one
_PASSWORD_PARAM = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)


def redacted(url: str) -> str:
    """A store URL as it may be printed or logged: any password shown as ***."""
    return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD.sub(r"\1:***@", url))


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL, None for a PostgreSQL one; InvalidInput (exit 2, one line
    naming the accepted forms) for anything else: an empty URL, another database, a SQLite
    URL without a file (`sqlite://`, in memory: nothing would outlive the process and no
    other process could see it) or with two slashes (`sqlite:/x.db`)."""
    if url.startswith(_SQLITE_URL) and len(url) > len(_SQLITE_URL):
        return Path(url[len(_SQLITE_URL) :])
    if url.startswith(_POSTGRESQL_URLS) and not url.endswith("://"):
        return None
    raise InvalidInput(f"invalid store URL {redacted(url)!r}: use {ACCEPTED_URLS}")


def owner_only_file(path: Path) -> None:
    """Create the database folder 0700 and file 0600 before SQLite opens it (its -wal and
    -shm files copy the file's mode).

    An existing file is never opened here: closing any descriptor of a file drops every
    POSIX lock this process holds on it, SQLite's included. A second Store on the same
    file in one process (controller --watch has two) would then leave the first one's
    connections unlocked; another process closing its last connection would take itself
    for the last one, checkpoint and delete the -wal file, and the first Store would go on
    committing into an unlinked WAL that nobody else can see."""
    make_private_dirs(path.parent)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def sqlite_connection(path: str, *, write: bool) -> Connection:
    try:
        # isolation_level None: sqlite3 begins nothing by itself, we issue BEGIN (IMMEDIATE)
        raw = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from exc
    conn = Connection(raw, "sqlite", sqlite3.Error)
    try:
        for pragma in _SQLITE_SETUP if write else (*_SQLITE_SETUP, "PRAGMA query_only=ON"):
            conn.run(pragma)
    except StoreError:
        conn.close()
        raise
    return conn


def postgresql_connection(conninfo: str, *, write: bool) -> Connection:
    import psycopg  # only a PostgreSQL store pays for it

    try:
        # Statements are prepared on the server at their first use (parsed once per
        # connection), and each execution is still planned for its values and the tables as
        # they are then (plan_cache_mode): a generic plan made while the store was nearly
        # empty read a job by scanning every job, 50 ms at 200,000 jobs, until autovacuum's
        # next ANALYZE (tests/test_store.py holds it). The writer's connection begins and ends
        # its transactions itself (autocommit at the driver), so that BEGIN goes with the lock
        # and COMMIT with the NOTIFY, each pair in one round trip.
        raw = psycopg.connect(conninfo, prepare_threshold=0, autocommit=write)
    except psycopg.Error as exc:
        raise StoreError(str(exc)) from exc
    try:
        raw.execute("SET plan_cache_mode = force_custom_plan", prepare=False)
        if not write:
            raw.commit()
    except psycopg.Error as exc:
        raw.close()
        raise StoreError(str(exc)) from exc
    if not write:  # psycopg opens each transaction with these: no extra round trip
        raw.isolation_level, raw.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
    return Connection(raw, "postgresql", psycopg.Error)
