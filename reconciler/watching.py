"""What `get -w` and the API's watch streams follow, as data: which events of a newest page
are new, what a new look at the selected objects changed (ADDED, MODIFIED, DELETED), and the
store's changes since a resourceVersion as `get` shows them (reads.py shows one look).
Nothing here writes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .api.kinds import KINDS
from .reads import SERVICES, Listing, decorated, objects, shown
from .selectors import Requirement
from .store import Store, StoredObject
from .store import repository as repo
from .store.feed import ChangeFeed
from .store.feed import poll_interval as poll_interval  # the API's watch broadcaster polls as the feed says

# Kinds whose shown status is partly derived at read time (pool and node usage, a node's
# readiness from its heartbeat's age, a notifier's delivery counts): it changes with no write
# to the object, so a follower (`get -w`) looks again on a timer, not only on a change.
DERIVED_STATUS = ("Pool", "Node", "Notifier")
DERIVED_LOOK = 1.0  # seconds between such looks

EVENT_POLL = 0.5  # seconds between looks for new events (get events -w, the API's events watch)


class NewEvents:
    """Which events of a newest page (oldest first, each with its row id) were not seen in
    the pages before: what `get events -w` and the API's events watch print. An id is no
    mark on its own (a PostgreSQL commit can make a smaller id visible after a larger one):
    the ids seen are kept, and those below the page's oldest forgotten and never printed."""

    def __init__(self, first: list[Any]):
        self._seen = {r.id for r in first}
        self._floor = min(self._seen, default=0)

    def among(self, rows: list[Any]) -> list[Any]:
        fresh = [r for r in rows if r.id >= self._floor and r.id not in self._seen]
        if rows:
            self._floor = max(self._floor, rows[0].id)
            self._seen = {i for i in self._seen if i >= self._floor}
        self._seen.update(r.id for r in fresh)
        return fresh


WatchEvent = tuple[str, StoredObject]  # ADDED | MODIFIED | DELETED, and the object as shown


class Seen:
    """What a `get -w` has shown of each selected object, to tell what a new look changed:
    ADDED, MODIFIED, or DELETED (gone from the look, or no longer matching, with the object
    as last shown): a service leaving the registry is DELETED too."""

    def __init__(self, listed: list[StoredObject]):
        self._shown = {o.name: (shown(o), o) for o in listed}

    def changes(self, looked: list[StoredObject]) -> Iterator[WatchEvent]:
        now = {o.name: (shown(o), o) for o in looked}
        for name, (look, o) in now.items():
            before = self._shown.get(name)
            if before is None or before[0] != look:
                yield ("ADDED" if before is None else "MODIFIED"), o
        gone = [o for name, (_, o) in self._shown.items() if name not in now]
        self._shown = now
        for o in gone:
            yield "DELETED", o

    def one(self, event: str, obj: StoredObject) -> Iterator[WatchEvent]:
        """What a watch stream's event of one object changes (a DELETED one is answered with
        the object as last shown: the stream's carries only its name, uid and labels)."""
        before = self._shown.get(obj.name)
        if event == "DELETED":
            if before is not None:
                del self._shown[obj.name]
                yield "DELETED", before[1]
            return
        look = shown(obj)
        if before is None or before[0] != look:
            self._shown[obj.name] = (look, obj)
            yield ("ADDED" if before is None else "MODIFIED"), obj


def watch(
    store: Store, kind: str, names: list[str], selector: list[Requirement] | None
) -> tuple[Listing, Iterator[WatchEvent]]:
    """The selected objects (`get -w` prints them; a missing name is in the listing's
    `missing`), and each of them again whenever it changes after that listing was read, and
    each one deleted or leaving the selection, forever: the caller stops. The listing printed
    is the one the changes start from: a write made after it was read (while it is printed,
    or its reader is slow) comes as a change."""
    feed = ChangeFeed(store)  # first: a write made while the listing is read is seen after it
    listing = objects(store, kind, names, selector, strict=False)
    return listing, _changes(store, feed, listing, kind, names, selector)


def _changes(
    store: Store, feed: ChangeFeed, listing: Listing, kind: str, names: list[str], selector: list[Requirement] | None
) -> Iterator[WatchEvent]:
    seen = Seen(listing.objects)
    derived = listing.kind in DERIVED_STATUS or kind.lower() in SERVICES
    next_look = time.monotonic() + DERIVED_LOOK
    while True:
        time.sleep(0.2)  # a CLI follower, not the controller: a short poll is the simple way
        if not feed.poll() and not (derived and time.monotonic() >= next_look):
            continue
        next_look = time.monotonic() + DERIVED_LOOK
        yield from seen.changes(objects(store, kind, names, selector, strict=False).objects)


@dataclass(frozen=True)
class Changes:
    """What a look at the change feed found: objects written since the last look, as `get`
    shows them, and (kind, name, resourceVersion) of those removed."""

    seq: int  # where the next look starts
    written: list[StoredObject]
    deleted: list[tuple[str, str, int]]


class ChangeReader:
    """The store's changes since a resourceVersion, as `get` shows them, one look at a time:
    the HTTP API's watch streams share one (server/watch.py), so a look costs one read of
    the change feed however many clients watch."""

    def __init__(self, store: Store, since: int | None = None, *, listen: bool = False):
        self.store = store
        self._feed = ChangeFeed(store, since=since, listen=listen)

    def wait(self, timeout: float) -> bool:
        """Until the store announces a change, or `timeout` (the poll): see ChangeFeed.wait."""
        return self._feed.wait(timeout)

    @property
    def seq(self) -> int:
        return self._feed.seq

    def look(self) -> Changes:
        """The changes and the objects they wrote, read in one transaction."""
        by_kind: dict[str, dict[str, int]] = {}  # kind -> name -> its last resourceVersion
        read: dict[str, list[StoredObject]] = {}
        with self.store.read() as session:
            for change in self._feed.poll_in(session):
                if change.kind in KINDS:  # a kind this reconciler does not know is not shown
                    by_kind.setdefault(change.kind, {})[change.name] = change.resource_version
            for kind, last in by_kind.items():
                read[kind] = repo.list_objects(session, kind=kind, names=sorted(last))
        written: list[StoredObject] = []
        deleted: list[tuple[str, str, int]] = []
        for kind, last in by_kind.items():
            listing = decorated(self.store, kind, read[kind], sorted(last), None, strict=False)
            written += listing.objects
            deleted += [(kind, name, last[name]) for name in listing.missing]
        return Changes(self._feed.seq, written, deleted)
