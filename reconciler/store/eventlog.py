"""The events objects' changes append, in the transaction of the change they record (`record`),
and the newest of them as `get events` and `describe` read them (`newest`)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from .dbapi import Connection, Row, Statement
from .repository import StoredObject
from .transactions import Tx


@dataclass(slots=True)  # not frozen: made for each event of a batch (see controller/intake.py)
class ObjectEvent:
    """One event about an object, as `record` writes it."""

    obj: StoredObject
    reason: str
    message: str
    warning: bool = False


def record(tx: Tx, *events: ObjectEvent) -> None:
    """Append events to the caller's transaction, so they commit with the change they record:
    in order, written by `write_pending` with the commit, every event of the transaction in
    one statement (a batch of the controller's steps appends several times)."""
    tx.events.extend(
        (
            tx.rv(),
            time.time(),
            e.obj.kind,
            e.obj.name,
            e.obj.uid,
            "Warning" if e.warning else "Normal",
            e.reason,
            e.message.replace("\0", "\\0"),  # PostgreSQL's text holds no NUL (an agent's words may)
        )
        for e in events
    )


def write_pending(tx: Tx) -> None:
    """The events `record` appended to the transaction, written now, before its commit. On
    PostgreSQL as one statement whatever their number (a row each would be a message each to
    the server); on SQLite, where a statement costs no round trip, a row each."""
    rows, tx.events = tx.events, []
    if tx.session.is_postgresql and len(rows) > 1:
        _INSERT_EVENTS.execute(tx.session, dict(zip(_EVENT_COLUMNS, map(list, zip(*rows, strict=True)), strict=True)))
    else:
        _INSERT_EVENT.execute_values(tx.session, rows)


_EVENT_COLUMNS = ("resource_version", "time", "kind", "name", "uid", "type", "reason", "message")
_INSERT_EVENT = Statement(
    "INSERT INTO events (resource_version, time, kind, name, uid, type, reason, message)"
    " VALUES (:resource_version, :time, :kind, :name, :uid, :type, :reason, :message)"
)
# PostgreSQL: the rows as one array per column
_INSERT_EVENTS = Statement(
    "INSERT INTO events (resource_version, time, kind, name, uid, type, reason, message)"
    " SELECT * FROM unnest(CAST(:resource_version AS integer[]), CAST(:time AS double precision[]),"
    " CAST(:kind AS varchar[]), CAST(:name AS varchar[]), CAST(:uid AS varchar[]), CAST(:type AS varchar[]),"
    " CAST(:reason AS varchar[]), CAST(:message AS varchar[]))"
)


@functools.cache
def _events(by_kind: bool, by_name: bool) -> Statement:
    where = " AND ".join(c for c, on in (("kind = :kind", by_kind), ("name = :name", by_name)) if on)
    return Statement(
        "SELECT id, resource_version, time, kind, name, uid, type, reason, message FROM events"
        + (f" WHERE {where}" if where else "")
        + " ORDER BY id DESC LIMIT :limit"
    )


def newest(session: Connection, *, kind: str | None = None, name: str | None = None, limit: int = 500) -> list[Row]:
    """Newest `limit` events, oldest first; rows with .time, .type, .reason, .kind, .name, .message."""
    query = _events(kind is not None, name is not None)
    rows = query.execute(session, {"kind": kind, "name": name, "limit": limit}).all()
    return rows[::-1]
