"""A write transaction (`Tx`: its resourceVersion, allocated once, and what it may write), a
thread's batch of them (`Batch`, the controller's group commit, which `Store.batch` drives),
the span of a thread's batches no other writer came between (`Epoch`) and the fence a
leader's writes carry (`Fence`). The `Store` (engine.py) opens,
commits and rolls them back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .dbapi import Connection, Statement, StoreError

if TYPE_CHECKING:
    from .engine import Store
    from .scheduling import Admission

META = Statement("SELECT value FROM meta WHERE key = :key")


def seq_in(conn: Connection) -> int:
    """The store's change sequence as the transaction `conn` sees it."""
    return int(META.execute(conn, {"key": "seq"}).scalar())


COUNT_UP = Statement("UPDATE meta SET value = value + 1 WHERE key = :key RETURNING value")  # a store-wide counter
# the next resourceVersion, when the transaction read the change sequence under its lock
_SET_SEQ = Statement("UPDATE meta SET value = :value WHERE key = 'seq'")


class Fenced(StoreError):
    """A leader's write found another term: the lease changed hands, this process no
    longer leads, and the write was rolled back."""


class Fence:
    """The term of the controller lease this process leads in (`serve`, controller/leader.py).
    The controller's writes (`Store.write(known=True)`) compare it with the lease row inside
    their transaction, under the lock every write takes, so a write either lands before the
    lease changed hands or fails with `Fenced`: a former leader (paused, cut off) cannot write.
    `valid_until` (time.monotonic) is when the lease may have expired unseen: what is not a
    write (spawning a process) asks `holds()` first."""

    def __init__(self, term: int, valid_until: float):
        self.term = term
        self.valid_until = valid_until
        self.broken = threading.Event()  # set when a write found another term

    def holds(self) -> bool:
        return not self.broken.is_set() and time.monotonic() < self.valid_until


class Tx:
    """One write transaction; `rv()` allocates its resourceVersion once, on first use.
    `session` is the writer's connection: run `Statement`s on it."""

    def __init__(
        self,
        session: Connection,
        store: Store,
        seq: int | None = None,
        epoch: Epoch | None = None,
        *,
        epoch_safe: bool = False,
    ):
        self.session = session
        self.epoch_safe = epoch_safe  # it may change no Job and no Notifier (Store.write)
        self.store = store
        self._rv: int | None = None
        self._seq = seq  # the change sequence as the lock read it (PostgreSQL), else None
        self.discarded = False
        self.events: list[tuple[Any, ...]] = []  # rows of the events to append with the commit (eventlog)
        # job uid -> its admission as this transaction left it with an agent's report kept on it
        # (placements.record_reports), until another write to that admission (scheduling); its
        # owner is left None, which nothing on a remote run's path reads
        self.reported: dict[str, Admission] = {}
        # node name -> its Node as read in this transaction (noderuns.serving_in), until it writes a Node
        self.nodes: dict[str, Any] = {}
        self.epoch = epoch if epoch is not None else Epoch(seq)
        # what is read once per epoch (`Store.epoch`): what only other writers change (the
        # notifiers) stays as read while it lasts
        self.memo: dict[str, Any] = self.epoch.memo

    def discard(self) -> None:
        """Roll back instead of committing (dry runs)."""
        self.discarded = True

    def writes(self, kind: str) -> None:
        """Called by every write of an object (and of the queue, as `queuing.QUEUE`): an
        epoch-safe transaction refuses a Job, a Notifier or the queue, which the threads whose
        epochs outlive it keep as they last saw them; a Node written drops the Nodes this
        transaction noted as read (`nodes`)."""
        if kind == "Node":
            self.nodes.clear()
        if self.epoch_safe and kind in KEPT_KINDS:
            raise StoreError(f"a {kind} written by an epoch-safe transaction (a bug): nothing is committed")

    def rv(self) -> int:
        if self._rv is None:
            if self._seq is None:
                self._rv = int(COUNT_UP.execute(self.session, {"key": "seq"}).scalar())
            else:
                # the lock holds the row since it was read: the next value is known, and on a
                # pipelined connection its write waits for no answer
                self._rv = self._seq + 1
                _SET_SEQ.execute(self.session, {"value": self._rv})
        return self._rv

    @property
    def changed(self) -> bool:
        return self._rv is not None


# What a batch epoch keeps as last seen (controller/known.py; `Tx.memo`: the notifiers, the
# queue's heads of line), so what an epoch-safe transaction may not write: whatever a new
# memo entry or kept object stands for must be named here (the queue as queuing.QUEUE).
KEPT_KINDS = frozenset({"Job", "Notifier", "Queue"})


class Epoch:
    """A span of one thread's batch transactions with no other writer's commit between them
    (`Store.epoch`): `seq` is the change sequence as its last commit left it."""

    __slots__ = ("memo", "seq")

    def __init__(self, seq: int | None):
        self.seq = seq
        self.memo: dict[str, Any] = {}


class Batch:
    """A thread's batch (`Store.batch`): its reads and controller writes share one write
    transaction, opened by the first of them and committed by `flush` (at the batch's end, or
    before something outside the store must see them: a spawn). `lost` is set when a
    transaction of the batch that wrote was rolled back or could not be committed: the
    writes since the previous flush are gone."""

    __slots__ = ("after", "committed", "conn", "lost", "opened", "pending", "tx", "undone", "wrote")

    def __init__(self) -> None:
        self.conn: Connection | None = None  # the writer's connection, while a transaction is open
        self.tx: Tx | None = None
        self.opened = 0.0  # time.monotonic() when it was opened
        self.after: list[Callable[[], None]] = []  # what waits for the commit (wake-ups)
        self.committed: list[Callable[[], None]] = []  # what only a commit may lead to (on_commit)
        self.undone: list[Callable[[], None]] = []  # what runs instead when the writes are lost (on_commit's or_else)
        self.pending: set[str] = set()  # what the open transaction wrote, as its writers named it (`mark`)
        self.lost = False
        self.wrote = False  # a write joined the open transaction (reads alone lose nothing when it rolls back)


@contextmanager
def transaction(conn: Connection, sqlite_begin: str) -> Iterator[None]:
    """Commits when the block ends normally, else rolls back."""
    conn.begin(sqlite_begin)
    done = False
    try:
        yield
        done = True
    finally:
        conn.end(commit=done)
