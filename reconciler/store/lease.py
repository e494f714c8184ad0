"""The controller lease: which of the `serve` processes sharing a store runs the reconcile
loop. One row (`leases`, name `controller`): its holder, when it expires and a term that
grows each time the lease changes hands. The leader renews it well within its period; the
others take it once it has expired, or at once when it was released or its holder is proven
gone. Times are the database's clock, read in the same transaction, so the servers' clocks
need not agree. These writes allocate no resourceVersion: no follower wakes for a renewal."""

from __future__ import annotations

from dataclasses import dataclass

from .dbapi import Connection, Statement
from .transactions import Tx

NAME = "controller"

_NOW = {
    "sqlite": Statement("SELECT (julianday('now') - 2440587.5) * 86400.0 AS now"),
    "postgresql": Statement("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now"),
}
_READ = Statement("SELECT holder, term, expires_at, acquired_at FROM leases WHERE name = :name")
_INSERT = Statement(
    "INSERT INTO leases (name, holder, term, expires_at, renewed_at, acquired_at)"
    " VALUES (:name, :holder, 1, :until, :now, :now)"
)
_TAKE = Statement(
    "UPDATE leases SET holder = :holder, term = term + 1, expires_at = :until, renewed_at = :now, acquired_at = :now"
    " WHERE name = :name AND (holder IS NULL OR expires_at <= :now OR holder = :gone) RETURNING term"
)
_RENEW = Statement(
    "UPDATE leases SET expires_at = :until, renewed_at = :now WHERE name = :name AND holder = :holder AND term = :term"
)
_RELEASE = Statement(
    "UPDATE leases SET holder = NULL, expires_at = :now WHERE name = :name AND holder = :holder AND term = :term"
)


@dataclass(frozen=True)
class Lease:
    holder: str | None  # None: released, anyone may take it
    term: int
    expires_at: float
    acquired_at: float  # when this term began
    now: float  # the database's clock when it was read

    @property
    def expires_in(self) -> float:
        return self.expires_at - self.now


def db_now(conn: Connection) -> float:
    """The database's clock, in epoch seconds: the one clock every server's lease agrees on."""
    return float(_NOW[conn.dialect].execute(conn).scalar())


def read(conn: Connection) -> Lease | None:
    row = _READ.execute(conn, {"name": NAME}).first()
    if row is None:
        return None
    return Lease(row.holder, int(row.term), float(row.expires_at), float(row.acquired_at), db_now(conn))


def take(tx: Tx, holder: str, period: float, *, gone: str | None = None) -> int | None:
    """Take the lease for `period` seconds if nobody holds it, it expired, or its holder is
    `gone` (proven gone by the caller); the new term, or None while another holds it."""
    now = db_now(tx.session)
    params = {"name": NAME, "holder": holder, "until": now + period, "now": now, "gone": gone}
    if _READ.execute(tx.session, {"name": NAME}).first() is None:  # under the write lock: nobody inserts meanwhile
        _INSERT.execute(tx.session, params)
        return 1
    term = _TAKE.execute(tx.session, params).scalar()
    return None if term is None else int(term)


def renew(tx: Tx, holder: str, term: int, period: float) -> bool:
    """Extend the lease by `period` from now; False when it changed hands (this term is over)."""
    now = db_now(tx.session)
    params = {"name": NAME, "holder": holder, "term": term, "until": now + period, "now": now}
    return _RENEW.execute(tx.session, params).rowcount == 1


def release(tx: Tx, holder: str, term: int) -> None:
    """Give the lease up (a clean stop): another server takes it at its next look."""
    _RELEASE.execute(tx.session, {"name": NAME, "holder": holder, "term": term, "now": db_now(tx.session)})
