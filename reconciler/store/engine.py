"""The one place that owns database connections: SQLite (embedded default) or PostgreSQL.

Write transactions are serialized store-wide (SQLite `BEGIN IMMEDIATE`; PostgreSQL a row
lock on the change sequence), which makes every compare-and-swap and every admission
decision a plain read-then-write without lost updates. Read transactions refuse writes
(SQLite `query_only`; PostgreSQL READ ONLY)."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from . import eventlog
from .batches import EPOCH_GAP, Batches
from .connect import (
    default_store_url,
    owner_only_file,
    postgresql_connection,
    redacted,
    sqlite_connection,
    sqlite_path,
    state_home,
)
from .dbapi import Connection, Statement, StoreError
from .listen import Listener, Wakeups, listening
from .transactions import META, Batch, Fence, Fenced, Tx, seq_in, transaction

CREATE_ATTEMPTS = 20  # opening a new store while another process creates it: ~8 s at most
SCHEMA_VERSION = 9  # 1 + the number of migrations.UPGRADES: what a current store records in meta
_LOCK_SEQ = Statement("SELECT value FROM meta WHERE key = 'seq' FOR UPDATE")
# a leader's write: the same lock, and the term of the controller lease in the same round trip
_LOCK_SEQ_TERM = Statement(
    "SELECT value, (SELECT term FROM leases WHERE name = 'controller') AS term FROM meta WHERE key = 'seq' FOR UPDATE"
)
_TERM = Statement("SELECT term FROM leases WHERE name = 'controller'")  # SQLite: BEGIN IMMEDIATE is the lock


class Store(Batches):
    def __init__(self, url: str | None = None):
        self.url = default_store_url() if url is None else url
        self.is_sqlite = self.url.startswith("sqlite")
        self.known_writes: set[int] = set()  # resourceVersions written with known=True: the change feed skips them
        self.fence: Fence | None = None  # set while this process leads through the controller lease
        self.origin = uuid.uuid4().hex[:16]  # names this store's own writes in its notifications
        self._wakeups = Wakeups()
        self._listener: Listener | None = None
        # called after each committed change, in the writer's thread: what waits on this
        # process's writes (a node agent's long poll) is told at once, not at its next poll
        self.committed: list[Callable[[], None]] = []
        # Writers of this process queue here rather than in SQLite's busy handler, which
        # sleeps in steps of up to 25 ms and turns contention between threads into latency.
        self._writer = threading.Lock()
        # resourceVersions of this process's epoch-safe commits (`write(epoch_safe=True)`), the
        # latest ones: written and read under `_writer`
        self._epoch_safe: deque[int] = deque(maxlen=EPOCH_GAP * 4)
        # Connections are kept, one per reading thread and one for the writer: opening one
        # per transaction would cost more than the reconcile loop's queries.
        self._local = threading.local()
        self._write_conn: Connection | None = None
        self._kept: list[Connection] = []
        self._kept_lock = threading.Lock()
        self.path = sqlite_path(self.url)
        self._file: tuple[int, int] | None = None  # (device, inode) of the SQLite file this store opened
        if self.path is not None:
            owner_only_file(self.path)
        else:
            self._conninfo = "postgresql://" + self.url.split("://", 1)[1]
            self._listen = listening()  # a bad RECONCILER_LISTEN is refused when the store opens
        self._migrate()
        if self.path is not None:
            found = os.stat(self.path)
            self._file = (found.st_dev, found.st_ino)

    @property
    def display_url(self) -> str:
        """The URL as it may be printed: without its password."""
        return redacted(self.url)

    def file_replaced(self) -> bool:
        """True when the SQLite file this store opened was deleted or replaced since: its
        connections would go on writing to a file no other process reads (a new one in its
        place starts empty). Always False on PostgreSQL."""
        if self._file is None or self.path is None:
            return False
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (found.st_dev, found.st_ino) != self._file

    @property
    def state_dir(self) -> Path:
        """Where run logs and exit files live: beside a SQLite file, else the user's state dir."""
        return self.path.parent if self.path is not None else state_home()

    def _connect(self, *, write: bool) -> Connection:
        if self.path is not None:
            return sqlite_connection(str(self.path), write=write)
        return postgresql_connection(self._conninfo, write=write)

    def _migrate(self) -> None:
        for attempt in range(CREATE_ATTEMPTS):
            try:
                if self._schema_version() != SCHEMA_VERSION:
                    self._upgrade()
                return
            except StoreError as exc:
                # Two processes opening a new SQLite store at once (`controller` and `apply`
                # started together): switching the new file to WAL takes an exclusive lock,
                # and SQLite answers the deadlock between two such switches with an immediate
                # "database is locked" to one of them, not a wait. That one tries again.
                if not self.is_sqlite or "locked" not in str(exc) or attempt == CREATE_ATTEMPTS - 1:
                    raise
                self.dispose()
                time.sleep(min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.0))

    def _schema_version(self) -> int | None:
        """The schema version by one plain query; None where that cannot tell (a new store
        has no meta table): the migrator, which knows the schema, finds out."""
        try:
            with self.read() as conn:
                found = META.execute(conn, {"key": "schema"}).scalar()
        except StoreError:
            return None
        return None if found is None else int(found)

    def _upgrade(self) -> None:
        # SQLAlchemy and SQLModel define the schema: imported only to create or upgrade it
        from .migrations import migrate

        with self._writer:
            conn = self._writer_connection()
            with transaction(conn, "BEGIN IMMEDIATE"):
                migrate(conn)

    def _usable(self, kept: Connection | None, *, write: bool) -> Connection:
        """The kept connection, or a new one kept in its place if it was lost."""
        if kept is not None and kept.usable():
            return kept
        if kept is not None:
            kept.close()
        conn = self._connect(write=write)
        with self._kept_lock:
            self._kept = [c for c in self._kept if not c.lost]
            self._kept.append(conn)
        return conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction: one consistent snapshot for all its statements (SQLite's
        WAL read transaction; PostgreSQL's REPEATABLE READ, READ ONLY on this thread's kept
        connection, where the default READ COMMITTED would give each statement its own).
        A write inside fails: SQLite's read connections are `query_only`. In a batch, this
        thread reads through the batch's transaction: its own writes, not yet committed, are
        what its next steps must see (and on PostgreSQL a read costs no BEGIN and COMMIT)."""
        batch: Batch | None = getattr(self._local, "batch", None)
        if batch is not None:
            with self._batched(batch, reading=True) as tx:
                yield tx.session
            return
        nested = getattr(self._local, "reading", False)
        if nested:  # a read inside a read on this thread: a connection of its own
            conn = self._connect(write=False)
        else:
            kept: Connection | None = getattr(self._local, "conn", None)
            conn = self._local.conn = self._usable(kept, write=False)
            self._local.reading = True
        try:
            with transaction(conn, "BEGIN"):
                yield conn
        finally:
            if nested:
                conn.close()
            else:
                self._local.reading = False

    def _writer_connection(self) -> Connection:
        conn = self._write_conn = self._usable(self._write_conn, write=True)
        return conn

    @contextmanager
    def write(self, *, known: bool = False, epoch_safe: bool = False) -> Iterator[Tx]:
        """A write transaction. `known`: the writer acts on what it writes itself (the
        controller's reconcile steps), so this process's change feed need not tell it: its
        resourceVersion goes into `known_writes`. Every other write, by whatever part of
        this process (a verb, a folder's applies), is seen by the change feed. While a
        `fence` is set, the controller's writes (`known`) check its term first (`Fenced`).
        `epoch_safe`: the writer changes no Job and no Notifier (a node's heartbeat, an
        agent's report; `Tx.writes` holds it to that), so the batch epochs of this process's
        threads outlive its commit (`epoch`).
        In a batch (`batch`), a `known` write joins the batch's transaction. A `Conflict`
        raised inside leaves the batch as it was: the controller's writes make their
        compare-and-swap before they write anything else. Any other exception rolls back the
        batch's uncommitted writes (`Batch.lost`): they were all or nothing together."""
        batch: Batch | None = getattr(self._local, "batch", None)
        if batch is not None:
            if known:
                with self._batched(batch) as tx:
                    yield tx
                return
            self.flush()  # any other write is a transaction of its own, after the batch's
        with self._writer:
            conn = self._writer_connection()
            seq = self._begin(conn, self.fence if known else None)
            commit = False
            try:
                tx = Tx(conn, self, seq, epoch_safe=epoch_safe)
                yield tx
                commit = not tx.discarded
            finally:
                if commit:
                    self._commit(conn, tx, known=known)
                else:
                    conn.end(commit=False)
            if commit and tx.changed and known:
                self.known_writes.add(tx.rv())
            if commit and tx.changed and epoch_safe:
                self._epoch_safe.append(tx.rv())  # before the write lock is let go: an epoch's next look sees it
        if commit and tx.changed:
            self._announce(known=known)

    def _begin(self, conn: Connection, fence: Fence | None) -> int | None:
        """Begin a write transaction holding the store-wide write lock (SQLite's BEGIN
        IMMEDIATE; PostgreSQL's row lock on the change sequence, BEGIN and the lock in one round
        trip), and check a leader's term under it. On failure nothing stays open. Returns the
        change sequence the lock read (PostgreSQL), from which `Tx.rv` takes the next value."""
        if fence is not None and fence.broken.is_set():
            raise Fenced("this server does not lead (it holds no controller lease): the write is refused")
        try:
            seq = None
            if self.is_sqlite:
                conn.begin("BEGIN IMMEDIATE")
                term = _TERM.execute(conn).scalar() if fence is not None else None
            else:
                lock = _LOCK_SEQ_TERM if fence is not None else _LOCK_SEQ
                row = conn.script(f"BEGIN; {lock.text(conn)}").fetchone()
                seq = None if row is None else int(row[0])
                term = row[1] if fence is not None and row is not None else None
            if fence is not None and term != fence.term:
                fence.broken.set()
                raise Fenced(f"the controller lease is in term {term}, not {fence.term}: another server leads")
        except BaseException:
            with suppress(StoreError):
                conn.end(commit=False)
            raise
        return seq

    def _commit(self, conn: Connection, tx: Tx, *, known: bool) -> None:
        """Commit, the events the transaction appended written first (`eventlog.record`: one
        statement on PostgreSQL); on PostgreSQL a change is announced (NOTIFY, which listen.py
        hears) in the same round trip, with the pipelined statements not answered yet (a
        failure of any one is raised and nothing is committed). The payload is the
        resourceVersion and, for the controller's own writes, this store's origin: digits and
        hex, safe in the statement's text."""
        if tx.events:
            try:
                eventlog.write_pending(tx)
            except BaseException:
                with suppress(StoreError):
                    conn.end(commit=False)
                raise
        if self.is_sqlite or not tx.changed:
            conn.end(commit=True)
            return
        payload = f"{tx.rv()} {self.origin}" if known else str(tx.rv())
        conn.end(commit=True, before=f"SELECT pg_notify('reconciler', '{payload}')")

    def _announce(self, *, known: bool) -> None:
        """After a committed change: this process's followers of the change feed hear of its
        own commits at once, as other processes' hear of them through PostgreSQL's NOTIFY (on
        SQLite nothing else tells them), and so do the `committed` listeners."""
        self._wakeups.announce(foreign=not known)
        for listener in self.committed:
            listener()

    def wakeups(self) -> Wakeups:
        """What the change feed's followers wait on between polls: on PostgreSQL announced by
        a listening thread (LISTEN/NOTIFY, started on first use; not with RECONCILER_LISTEN=off),
        on SQLite by nothing."""
        if self.path is None and self._listener is None and self._listen:
            with self._kept_lock:
                if self._listener is None:
                    self._listener = Listener(self._conninfo, self._wakeups, self.origin)
        return self._wakeups

    def change_seq(self) -> int:
        """The cheap "did anything change" probe other processes poll."""
        with self.read() as conn:
            return seq_in(conn)

    def dispose(self) -> None:
        with self._kept_lock:
            kept, self._kept = self._kept, []
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for conn in kept:
            conn.close()
        self._write_conn = None
        self._local = threading.local()
