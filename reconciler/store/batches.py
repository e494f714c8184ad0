"""The controller's group commit, as a part of `Store` (engine.py): a thread's batch of steps
shares one write transaction (`batch`, `flush`), and its batch transactions form epochs in
which what it read or wrote stays as stored (`epoch`). The rest of the store (connections,
`read`, `write`, the commit itself) is engine.py's."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, cast

from ..errors import Conflict
from .dbapi import Connection, StoreError
from .transactions import Batch, Epoch, Fence, Tx, seq_in

if TYPE_CHECKING:
    from .engine import Store
    from .repository import StoredObject
    from .scheduling import Admission

EPOCH_GAP = 64  # epoch-safe commits an epoch outlives between two of its transactions, at most


class Batches(ABC):
    """What `Store` keeps for its batches, and the parts of it they use (engine.py)."""

    _local: threading.local
    _writer: threading.Lock
    _epoch_safe: deque[int]
    known_writes: set[int]
    fence: Fence | None

    @abstractmethod
    def _writer_connection(self) -> Connection: ...
    @abstractmethod
    def _begin(self, conn: Connection, fence: Fence | None) -> int | None: ...
    @abstractmethod
    def _commit(self, conn: Connection, tx: Tx, *, known: bool) -> None: ...
    @abstractmethod
    def _announce(self, *, known: bool) -> None: ...

    @contextmanager
    def batch(self) -> Iterator[Batch]:
        """Group commit for this thread: its reads and the controller's writes
        (`write(known=True)`) share one write transaction, opened by the first of them and
        committed when the block ends or at `flush`. Whatever acts on a write outside the
        store waits for its commit: `after_commit` (wake-ups), `flush` (a spawn). An exception
        out of the block rolls back what is not committed."""
        if getattr(self._local, "batch", None) is not None:
            raise RuntimeError("a batch inside a batch")
        batch = self._local.batch = Batch()
        try:
            yield batch
            self.flush()
        except BaseException:
            self._abandon(batch)
            raise
        finally:
            self._local.batch = None

    def in_batch(self) -> bool:
        """Whether this thread has writes not yet committed (a batch's open transaction)."""
        batch: Batch | None = getattr(self._local, "batch", None)
        return batch is not None and batch.conn is not None

    def epoch(self, *, open: bool = True) -> object | None:
        """This thread's batch epoch: what was read or written through its batch transactions
        in one epoch stays as stored until this thread writes it again. A batch holds the
        write lock (SQLite's, or PostgreSQL's row lock on the change sequence, which every
        writer takes), so no other writer commits while its transaction is open; and the
        epoch outlives the transaction's commit when the next one, of this thread's batches,
        finds the change sequence where that commit left it (every write of an object
        advances it), so no other writer committed in between, or moved only by this
        process's epoch-safe commits (`write(epoch_safe=True)`), which change no Job and no
        Notifier, all that an epoch keeps (`KEPT_KINDS`). In a batch with no transaction
        open, `open` opens one (an epoch is certain only under the write lock); else the
        epoch of its last commit, which the next transaction continues or ends. None outside a
        batch."""
        batch: Batch | None = getattr(self._local, "batch", None)
        if batch is None:
            return None
        if batch.tx is None:
            if not open:
                return getattr(self._local, "epoch", None)
            self._open(batch)
        assert batch.tx is not None
        return batch.tx.epoch

    def batch_age(self) -> float:
        """Seconds since this thread's batch opened its transaction (0 when none is open):
        the write lock has been held that long."""
        batch: Batch | None = getattr(self._local, "batch", None)
        return 0.0 if batch is None or batch.conn is None else time.monotonic() - batch.opened

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once this thread's uncommitted writes are committed: at once when
        there are none (outside a batch, or between its transactions)."""
        batch: Batch | None = getattr(self._local, "batch", None)
        if batch is not None and batch.conn is not None:
            batch.after.append(action)
        else:
            action()

    def on_commit(self, action: Callable[[], None], *, or_else: Callable[[], None] | None = None) -> None:
        """Run `action` once this thread's uncommitted writes are committed, and never if
        they are not (after_commit's wake-ups run either way: a look too many costs little;
        this is for what cannot be undone, such as removing files or starting a process):
        at once when there are none. `or_else` runs instead when they are lost (rolled back,
        or their commit failed). Each runs in its turn with the others registered, and one
        that raises keeps none after it from running (its error is raised after them)."""
        batch: Batch | None = getattr(self._local, "batch", None)
        if batch is not None and batch.conn is not None:
            batch.committed.append(action)
            if or_else is not None:
                batch.undone.append(or_else)
        else:
            action()

    def mark(self, name: str) -> None:
        """Name what this thread's open batch transaction just wrote (a job's uid), so that
        `uncommitted(name)` can tell until it commits. Outside a batch, a no-op."""
        batch: Batch | None = getattr(self._local, "batch", None)
        if batch is not None and batch.conn is not None:
            batch.pending.add(name)

    def uncommitted(self, name: str) -> bool:
        """Whether this thread wrote something named `name` that is not committed yet."""
        batch: Batch | None = getattr(self._local, "batch", None)
        return batch is not None and batch.conn is not None and name in batch.pending

    def reported(self, uid: str) -> Admission | None:
        """The admission of job `uid` with the agent's report that this thread's open batch
        transaction kept on it, or its last one when nothing was committed since, as a read
        would find it but for its owner (left None); None when none kept one (`Tx.reported`).
        A step acting on a handed report then reads nothing (on PostgreSQL a round trip)."""
        tx = self._open_tx()
        return tx.reported.get(uid) if tx is not None else None

    def noted_node(self, name: str) -> StoredObject | None:
        """The Node `name` as this thread's open batch transaction read it, or
        its last one when nothing was committed since (`Tx.nodes`: the serving checks of the
        agents' reports it wrote); None when neither did, or the node is not stored."""
        tx = self._open_tx()
        return tx.nodes.get(name) if tx is not None else None

    def _open_tx(self) -> Tx | None:
        """This thread's open batch transaction, if any."""
        batch: Batch | None = getattr(self._local, "batch", None)
        return batch.tx if batch is not None else None

    def flush(self) -> None:
        """Commit this thread's batch transaction, if one is open, and run what waited for it.
        A failure marks the batch `lost` and raises."""
        batch: Batch | None = getattr(self._local, "batch", None)
        if batch is None or batch.conn is None or batch.tx is None:
            return
        conn, tx = batch.conn, batch.tx
        batch.conn = batch.tx = None
        batch.pending.clear()
        committed = False
        try:
            self._commit(conn, tx, known=True)
            committed = True
            tx.epoch.seq = tx.rv() if tx.changed else tx.epoch.seq  # where this commit left the sequence
            self._local.epoch = tx.epoch
            self._local.carried = (tx.epoch.seq, tx.reported, tx.nodes)
        except BaseException:
            batch.lost = True
            with suppress(StoreError):
                conn.end(commit=False)
            raise
        finally:
            if committed and tx.changed:
                self.known_writes.add(tx.rv())
            self._writer.release()
            after, batch.after = batch.after, []
            done, batch.committed = batch.committed, []
            undone, batch.undone = batch.undone, []
            if committed and tx.changed:
                self._announce(known=True)
            # `after` also after a failure: a wake-up too many costs a look
            _run_all(after + (done if committed else undone))

    @contextmanager
    def _batched(self, batch: Batch, *, reading: bool = False) -> Iterator[Tx]:
        """The batch's transaction, opened if need be. No savepoint per block (two round trips
        each on PostgreSQL): a `Conflict` comes before the block wrote anything (a
        compare-and-swap is a block's first write, or a version check comes first), and any
        other exception rolls the whole batch back (in a read, only a database error: on
        PostgreSQL it ends the transaction)."""
        if batch.conn is None:
            self._open(batch)
        tx = batch.tx
        assert tx is not None
        batch.wrote = batch.wrote or not reading
        try:
            yield tx
        except Conflict:
            raise
        except StoreError:
            self._abandon(batch)
            raise
        except BaseException:
            if not reading:
                self._abandon(batch)
            raise

    def _open(self, batch: Batch) -> None:
        self._writer.acquire()
        try:
            conn = self._writer_connection()
            seq = self._begin(conn, self.fence)
            try:
                found = seq_in(conn) if seq is None else seq  # SQLite: one point query
                # the batch's statements are pipelined (PostgreSQL): a write whose answer no
                # step reads travels with the next statement that is read, not on its own
                conn.pipeline()
            except BaseException:
                with suppress(StoreError):
                    conn.end(commit=False)
                raise
        except BaseException:
            self._writer.release()
            raise
        last: Epoch | None = getattr(self._local, "epoch", None)
        epoch = last if last is not None and self._continues(last.seq, found) else Epoch(found)
        epoch.seq = found
        self._local.epoch = None  # until this transaction commits
        batch.conn, batch.tx, batch.opened = conn, Tx(conn, cast("Store", self), seq, epoch), time.monotonic()
        # what the last one noted, when nothing at all was committed since (an epoch-safe commit
        # may be another report on the same admission, a heartbeat): as that one left it
        carried: tuple[int, dict[str, Admission], dict[str, Any]] | None = getattr(self._local, "carried", None)
        self._local.carried = None
        if carried is not None and carried[0] == found:
            batch.tx.reported, batch.tx.nodes = carried[1], carried[2]
        batch.wrote = False

    def _continues(self, seq: int | None, found: int) -> bool:
        """Whether an epoch that `seq` ended is still one with the change sequence at
        `found`: no commit came between, or only this process's epoch-safe ones (a few: an
        epoch that missed many is ended rather than searched)."""
        if seq == found:
            return True
        if seq is None or not 0 < found - seq <= EPOCH_GAP:
            return False
        safe = set(self._epoch_safe)
        return all(rv in safe for rv in range(seq + 1, found + 1))

    def _abandon(self, batch: Batch) -> None:
        """Roll back the batch's open transaction (its writes are lost) and free the lock."""
        conn = batch.conn
        if conn is None:
            return
        batch.conn = batch.tx = None
        batch.pending.clear()
        batch.committed.clear()  # rolled back: what waited for its commit never happens
        undone, batch.undone = batch.undone, []
        batch.lost = batch.lost or batch.wrote  # a transaction that only read loses nothing
        try:
            with suppress(StoreError):
                conn.end(commit=False)
        finally:
            self._writer.release()
        _run_all(undone)


def _run_all(actions: list[Callable[[], None]]) -> None:
    """Run every action, even past one that raises, then raise the first error: an action
    skipped would be a wake-up lost, or a spawn neither started nor forgotten."""
    first: BaseException | None = None
    for action in actions:
        try:
            action()
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first
