"""The change feed: who follows the store's writes (the controller's change watcher, `up`,
`wait`, `get -w`) polls it. A look costs one tiny query when nothing changed, and the rows
that changed otherwise: every write bumps one store-wide sequence, and each object row
carries the sequence number of its last write."""

from __future__ import annotations

from dataclasses import dataclass

from . import scheduling as sched
from .engine import Store


@dataclass(frozen=True)
class Change:
    kind: str
    name: str
    resource_version: int


class ChangeFeed:
    def __init__(self, store: Store, *, skip_known: bool = False, since: int | None = None, reports: bool = False):
        """`skip_known`: leave out the writes made with `store.write(known=True)` (the
        controller's own steps, which act on what they write). `since`: the change sequence
        to follow from (a list's resourceVersion), instead of now. `reports`: a remote
        agent's report on a job's admission counts as a change of that job (the controller
        acts on them; the job object itself is not written by a report)."""
        self.store = store
        self.skip_known = skip_known
        self.reports = reports
        self.seq = store.change_seq() if since is None else since

    def poll(self) -> list[Change]:
        """Objects written or deleted since the last poll, oldest first."""
        current = self.store.change_seq()
        if current == self.seq:
            return []
        with self.store.read() as session:
            rows = sched.changed_since(session, self.seq)
            if self.reports:
                rows += [("Job", name, rv) for name, rv in sched.reported_since(session, self.seq)]
        changes = [Change(kind, name, rv) for kind, name, rv in rows]
        self.seq = max([current, *(c.resource_version for c in changes)])
        if self.skip_known:
            known = self.store.known_writes
            changes = [c for c in changes if c.resource_version not in known]
            self.store.known_writes = {rv for rv in known if rv > self.seq}
        return changes
