"""The change feed: who follows the store's writes (the controller's change watcher, `up`,
`wait`, `get -w`) polls it. A look costs one tiny query when nothing changed, and the rows
that changed otherwise: every write bumps one store-wide sequence, and each object row
carries the sequence number of its last write."""

from __future__ import annotations

import os
from typing import NamedTuple

from ..errors import InvalidInput
from . import placements
from . import scheduling as sched
from .dbapi import Connection
from .engine import Store
from .transactions import seq_in

POLL_INTERVAL = 0.05  # seconds between looks when nothing announces a change (RECONCILER_POLL_INTERVAL)


def poll_interval() -> float:
    """How often followers poll the feed: the safety net under PostgreSQL's notifications,
    the only way on SQLite. `RECONCILER_POLL_INTERVAL` (seconds) sets it, for tests and for
    operators who would rather spare the database the polls."""
    text = os.environ.get("RECONCILER_POLL_INTERVAL")
    if not text:
        return POLL_INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise InvalidInput(f"RECONCILER_POLL_INTERVAL={text!r}: give seconds, more than 0 and at most 3600")
    return value


class Change(NamedTuple):  # a tuple: made for every changed row a poll reads
    kind: str
    name: str
    resource_version: int
    uid: str  # which object of that name (one deleted and made again is another)


class ChangeFeed:
    def __init__(
        self,
        store: Store,
        *,
        skip_known: bool = False,
        since: int | None = None,
        listen: bool = False,
        reports: bool = False,
    ):
        """`skip_known`: leave out the writes made with `store.write(known=True)` (the
        controller's own steps, which act on what they write). `since`: the change sequence
        to follow from (a list's resourceVersion), instead of now. `listen`: the follower
        calls `wait` between polls, to be woken by the store's notifications. `reports`: a
        remote agent's report on a job's admission counts as a change of that job (the
        controller acts on them; the job object itself is not written by a report)."""
        self.store = store
        self.skip_known = skip_known
        self.reports = reports
        # before the first look, so that no notification falls between
        self._seen = store.wakeups().seen(foreign=skip_known) if listen else 0
        self.seq = store.change_seq() if since is None else since

    def wait(self, timeout: float) -> bool:
        """Until the store announces a change this feed follows (PostgreSQL's NOTIFY; with
        `skip_known`, not the controller's own writes) or `timeout` passes; True when a
        change was announced (`poll` now), False when the time passed."""
        seen, self._seen = self._seen, self.store.wakeups().wait(self._seen, timeout, foreign=self.skip_known)
        return self._seen != seen

    def poll(self) -> list[Change]:
        """Objects written or deleted since the last poll, oldest first."""
        with self.store.read() as session:
            return self.poll_in(session)

    def poll_in(self, session: Connection) -> list[Change]:
        """`poll` in the caller's read transaction (which may read the changed objects in the
        same snapshot): the sequence and the rows are read together, so a poll that finds
        changes costs one transaction, not two (on PostgreSQL, a BEGIN and a COMMIT less)."""
        current = seq_in(session)
        if current == self.seq:
            return []
        rows = sched.changed_since(session, self.seq)
        if self.reports:
            rows += [("Job", name, rv, uid) for name, rv, uid in placements.reported_since(session, self.seq)]
        changes = list(map(Change._make, rows))
        self.seq = max([current, *(c.resource_version for c in changes)])
        if self.skip_known:
            known = self.store.known_writes
            changes = [c for c in changes if c.resource_version not in known]
            self.store.known_writes = {rv for rv in known if rv > self.seq}
        return changes
