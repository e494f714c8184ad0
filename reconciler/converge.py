"""Following a set of jobs until they settle, through the change feed: each look reads only
the jobs written since the last one, so `up` on thousands of jobs stays cheap while the
controller in the same process does the work."""

from __future__ import annotations

import json
from typing import Any

from .store import Store
from .store import repository as repo
from .store import scheduling as sched


def settled(status: dict[str, Any]) -> bool:
    """A run job is settled when Completed; a service once it is Running (it never ends);
    a job deleted meanwhile is settled too."""
    phase = status.get("phase")
    return phase in ("Completed", "Deleted") or (phase == "Running" and bool(status.get("service")))


def succeeded(status: dict[str, Any]) -> bool:
    return status.get("outcome") == "Succeeded" or (status.get("service") and status.get("phase") == "Running")


class JobWatch:
    def __init__(self, store: Store, names: list[str]):
        self.store = store
        self.names = set(names)
        self.statuses: dict[str, dict[str, Any]] = {}
        self._unsettled: set[str] = set()  # kept up to date per change: a look costs the changes, not the jobs
        self.seq = store.change_seq()
        self._load(self.names)

    def _load(self, names: set[str]) -> None:
        with self.store.read() as session:
            found = repo.statuses(session, kind="Job", names=names)
        for name in names:
            o = found.get(name)
            status = self.statuses[name] = (
                {"phase": "Deleted", "reason": "Deleted"}
                if o is None
                else {**o.status, "service": json.loads(o.spec_text).get("type") == "service"}
            )
            if settled(status):
                self._unsettled.discard(name)
            else:
                self._unsettled.add(name)

    def poll(self) -> set[str]:
        """Names of watched jobs written since the last poll (their statuses are refreshed)."""
        current = self.store.change_seq()
        if current == self.seq:
            return set()
        with self.store.read() as session:
            rows = sched.changed_since(session, self.seq)
        self.seq = max([current] + [rv for _, _, rv in rows])
        changed = {name for kind, name, _ in rows if kind == "Job" and name in self.names}
        if changed:
            self._load(changed)
        return changed

    def all_settled(self) -> bool:
        """Every job settled, and no completion is about an older version of its job (a spec
        change or rerun the controller has not picked up yet)."""
        if self._unsettled:
            return False
        from .commands import stale_jobs

        with self.store.read() as session:
            objs = repo.list_objects(session, kind="Job", names=sorted(self.names))
            return not stale_jobs(session, objs)

    def unsettled(self) -> list[str]:
        return sorted(self._unsettled)
