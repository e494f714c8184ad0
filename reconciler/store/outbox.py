"""The notifier outbox: job events waiting for delivery, written in the transaction of the job
status they report; and per notifier what its deliveries came to, and who delivers them.

None of these writes allocates a resourceVersion: a delivery is no change of any object, so
followers of the change feed are not woken by one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .dbapi import Connection, Row, Statement
from .transactions import Tx

_NOTIFIERS = Statement("SELECT name, spec FROM objects WHERE kind = 'Notifier' ORDER BY name")
_NOTIFIER_SPEC = Statement("SELECT spec FROM objects WHERE kind = 'Notifier' AND name = :name")


def notifiers(session: Connection) -> list[tuple[str, str]]:
    """(name, spec text) of every notifier: what a status write that reports an event reads."""
    return [(row.name, row.spec) for row in _NOTIFIERS.execute(session).all()]


def notifier_spec(session: Connection, name: str) -> str | None:
    """The notifier's spec text, None once it is deleted."""
    found = _NOTIFIER_SPEC.execute(session, {"name": name}).scalar()
    return None if found is None else str(found)


@dataclass(frozen=True, slots=True)
class Pending:
    """One event for one notifier, as the outbox keeps it."""

    notifier: str
    event_id: str
    body: str
    created_at: float


_ADD = Statement(
    "INSERT INTO outbox (notifier, event_id, body, created_at, next_attempt_at, attempts)"
    " VALUES (:notifier, :event_id, :body, :created_at, :created_at, 0)"
)


def add(tx: Tx, pending: Iterable[Pending]) -> None:
    """Write events in the caller's transaction, due at once."""
    rows = [
        {"notifier": p.notifier, "event_id": p.event_id, "body": p.body, "created_at": p.created_at} for p in pending
    ]
    _ADD.execute_rows(tx.session, rows)


_DUE = Statement(
    "SELECT id, event_id, body, created_at, attempts FROM outbox WHERE notifier = :notifier"
    " AND next_attempt_at <= :now ORDER BY next_attempt_at, id LIMIT :limit"
)
_NEXT_DUE = Statement("SELECT min(next_attempt_at) FROM outbox WHERE notifier = :notifier")


def due(session: Connection, notifier: str, now: float, limit: int) -> list[Row]:
    """The notifier's events due by `now`, soonest first: rows with id, event_id, body,
    created_at, attempts."""
    return _DUE.execute(session, {"notifier": notifier, "now": now, "limit": limit}).all()


def next_due(session: Connection, notifier: str) -> float | None:
    """When the notifier's soonest event is due; None when none is pending."""
    found = _NEXT_DUE.execute(session, {"notifier": notifier}).scalar()
    return None if found is None else float(found)


_ENSURE = Statement(
    "INSERT INTO deliveries (notifier, delivered, failed) VALUES (:notifier, 0, 0) ON CONFLICT (notifier) DO NOTHING"
)
_DELETE = Statement("DELETE FROM outbox WHERE id = :id")
_COUNT_DELIVERED = Statement(
    "UPDATE deliveries SET delivered = delivered + :count, last_delivery_at = :now WHERE notifier = :notifier"
)
_RETRY = Statement("UPDATE outbox SET attempts = :attempts, next_attempt_at = :at, last_error = :error WHERE id = :id")
_NOTE_ERROR = Statement("UPDATE deliveries SET last_error = :error, last_error_at = :now WHERE notifier = :notifier")
_COUNT_FAILED = Statement(
    "UPDATE deliveries SET failed = failed + :count, last_error = :error, last_error_at = :now"
    " WHERE notifier = :notifier"
)
_EXPIRE = Statement("DELETE FROM outbox WHERE notifier = :notifier AND created_at <= :cutoff")


def delivered(tx: Tx, notifier: str, ids: list[int], now: float) -> None:
    """Delivered: the rows go, the count grows (rows already gone, with a deleted notifier,
    count for nothing)."""
    count = sum(_DELETE.execute(tx.session, {"id": i}).rowcount for i in ids)
    if count:
        _ENSURE.execute(tx.session, {"notifier": notifier})
        _COUNT_DELIVERED.execute(tx.session, {"notifier": notifier, "count": count, "now": now})


def retry(tx: Tx, notifier: str, row_id: int, *, attempts: int, at: float, error: str, now: float) -> None:
    """A failed attempt: try again at `at`."""
    params = {"id": row_id, "attempts": attempts, "at": at, "error": error}
    if _RETRY.execute(tx.session, params).rowcount:
        _ENSURE.execute(tx.session, {"notifier": notifier})
        _NOTE_ERROR.execute(tx.session, {"notifier": notifier, "error": error, "now": now})


def give_up(tx: Tx, notifier: str, row_id: int, *, error: str, now: float) -> None:
    """A failed attempt past the retry window: the event is failed, with its last error."""
    if _DELETE.execute(tx.session, {"id": row_id}).rowcount:
        _count_failed(tx, notifier, 1, error, now)


def expire(tx: Tx, notifier: str, *, cutoff: float, error: str, now: float) -> int:
    """Give up every event of the notifier made at or before `cutoff` (its retry window is
    over), whether or not it was tried; returns how many."""
    count = _EXPIRE.execute(tx.session, {"notifier": notifier, "cutoff": cutoff}).rowcount
    if count:
        _count_failed(tx, notifier, count, error, now)
    return count


def _count_failed(tx: Tx, notifier: str, count: int, error: str, now: float) -> None:
    _ENSURE.execute(tx.session, {"notifier": notifier})
    _COUNT_FAILED.execute(tx.session, {"notifier": notifier, "count": count, "error": error, "now": now})


_DROP_PENDING = Statement("DELETE FROM outbox WHERE notifier = :notifier")
_DROP_COUNTS = Statement("DELETE FROM deliveries WHERE notifier = :notifier")


def drop(tx: Tx, notifier: str) -> None:
    """A deleted notifier: its pending events and its counts go with it."""
    _DROP_PENDING.execute(tx.session, {"notifier": notifier})
    _DROP_COUNTS.execute(tx.session, {"notifier": notifier})


# -- who delivers: a lease per notifier -------------------------------------------------------
_HOLDER = Statement("SELECT owner, lease_until FROM deliveries WHERE notifier = :notifier")
_LEASE = Statement(
    "UPDATE deliveries SET owner = :owner, lease_until = :until WHERE notifier = :notifier"
    " AND (owner IS NULL OR owner = :owner OR lease_until <= :now OR owner = :gone)"
)
_UNLEASE = Statement(
    "UPDATE deliveries SET owner = NULL, lease_until = NULL WHERE notifier = :notifier AND owner = :owner"
)


def holder(session: Connection, notifier: str) -> tuple[str, float] | None:
    """(owner, lease end) of the process delivering the notifier's events, if any."""
    row = _HOLDER.execute(session, {"notifier": notifier}).first()
    return None if row is None or row.owner is None else (row.owner, float(row.lease_until))


def lease(tx: Tx, notifier: str, owner: str, *, now: float, until: float, gone: str | None = None) -> bool:
    """Take or renew the right to deliver the notifier's events until `until`: free, ours,
    expired, or held by `gone` (an owner proven gone). Compare-and-swap."""
    _ENSURE.execute(tx.session, {"notifier": notifier})
    params = {"notifier": notifier, "owner": owner, "until": until, "now": now, "gone": gone}
    return _LEASE.execute(tx.session, params).rowcount == 1


def release(tx: Tx, notifier: str, owner: str) -> None:
    _UNLEASE.execute(tx.session, {"notifier": notifier, "owner": owner})


# -- what `get` and `describe` show ---------------------------------------------------------
@dataclass(frozen=True)
class Deliveries:
    delivered: int
    pending: int
    failed: int
    last_error: str | None
    last_error_at: float | None
    last_delivery_at: float | None


_PENDING = Statement("SELECT count(*) FROM outbox WHERE notifier = :notifier")
_COUNTS = Statement(
    "SELECT delivered, failed, last_error, last_error_at, last_delivery_at FROM deliveries WHERE notifier = :notifier"
)


def deliveries(session: Connection, notifier: str) -> Deliveries:
    pending = int(_PENDING.execute(session, {"notifier": notifier}).scalar() or 0)
    row = _COUNTS.execute(session, {"notifier": notifier}).first()
    if row is None:
        return Deliveries(0, pending, 0, None, None, None)
    return Deliveries(row.delivered, pending, row.failed, row.last_error, row.last_error_at, row.last_delivery_at)
