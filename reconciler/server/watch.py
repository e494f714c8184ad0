"""Watch streams: one thread follows the store's change feed for every client and fans the
changes out, so a hundred watchers cost what one does (no poll per client).

Each change becomes an event kept in a bounded history, so a client watching from the
resourceVersion of a list it just took gets what changed since; one whose resourceVersion is
older than the history gets 410 Gone and lists again, as Kubernetes answers a compacted
version. Each stream calls an object's change ADDED when the object was created after its
resourceVersion (the object's created resourceVersion says, as etcd's create_revision does),
else MODIFIED; DELETED when it is gone.

While no stream is open the broadcaster looks once a second, not after every commit (each
look is a read of the store, and a server's controller commits several times a job); a new
stream first has it look, so it starts from the store as it is. `watch_lines` is one client's
stream, as the route sends it."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import math
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..api.kinds import KINDS, KindInfo
from ..api.meta import API_VERSION
from ..reads import objects
from ..selectors import Requirement, matches
from ..store import Store, StoredObject
from ..threads import critical
from ..watching import EVENT_POLL, ChangeReader, NewEvents, poll_interval
from ..wire import event_doc, status
from .redact import without_secrets

log = logging.getLogger("reconciler.server")

HISTORY = 20_000  # events kept for clients that connect from an older resourceVersion
BACKLOG = 1_000  # batches a slow client may fall behind before its stream is ended (410)
IDLE_LOOK = 1.0  # seconds between looks while no stream is open


class Expired(Exception):
    """The resourceVersion is older than the history: list again."""


@dataclass(frozen=True)
class Event:
    resource_version: int
    type: str  # ADDED | MODIFIED | DELETED: as the broadcaster saw it (a stream says it for itself)
    kind: str
    name: str
    content: StoredObject | dict[str, Any]  # the object as written, or a DELETED's document
    labels: dict[str, str]
    old_labels: dict[str, str] | None  # at the broadcaster's look before; None when it had not seen the object
    created_rv: int = 0  # the object's creation (a DELETED's: that of the object it removed)

    @property
    def uid(self) -> str:
        content = self.content
        return content.uid if not isinstance(content, dict) else str(content.get("metadata", {}).get("uid", ""))

    @functools.cached_property
    def document(self) -> dict[str, Any]:
        """The object as `get -o json` shows it (DELETED: name, uid, labels), made when a
        stream first sends it: a look with nobody watching makes none (the server's
        broadcaster looks after every commit of the controller, ten or so a job)."""
        return self.content if isinstance(self.content, dict) else self.content.manifest()


@dataclass(frozen=True)
class Batch:
    events: list[Event]
    seq: int  # every change up to this resourceVersion is in this batch or an earlier one (a bookmark)


@dataclass
class Subscription:
    since: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Batch | None] = field(default_factory=asyncio.Queue)
    backlog: Batch = field(default_factory=lambda: Batch([], 0))
    ended: bool = False


@dataclass
class _Known:
    uid: str
    labels: dict[str, str]
    resource_version: int
    created_rv: int


class Broadcaster:
    def __init__(self, store: Store, *, history: int = HISTORY, interval: float | None = None, idle: float = IDLE_LOOK):
        """`interval`: the poll under the store's notifications (feed.poll_interval), while a
        stream is open; `idle`: the period of the looks while none is."""
        self.store = store
        self.interval = poll_interval() if interval is None else interval
        self.idle = idle
        self._history: deque[Event] = deque()
        self._history_size = history
        self._floor = 0  # every event after this resourceVersion is in the history
        self._seq = 0  # every event up to this resourceVersion is in the history (or older than it)
        self._known: dict[tuple[str, str], _Known] = {}
        self._subscriptions: list[Subscription] = []
        self._lock = threading.Lock()
        self._looking = threading.Lock()  # one look at a time: the thread's, or a new stream's catch_up
        self._streams_came = threading.Event()  # ends an idle wait
        self._stop = threading.Event()
        self._reader: ChangeReader | None = None
        self._thread = critical("watch-broadcaster", self._run)

    def start(self) -> Broadcaster:
        """Learn every object (to tell a creation from a change), then follow from there."""
        reader = ChangeReader(self.store, listen=True)
        for info in KINDS.values():
            for o in objects(self.store, info.kind, [], None).objects:
                self._known[(o.kind, o.name)] = _Known(o.uid, o.labels, o.resource_version, o.created_rv)
        self._reader = reader
        self._floor = self._seq = reader.seq
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._streams_came.set()
        self.store.wakeups().poke()
        self._thread.join(2)
        with self._lock:
            for sub in self._subscriptions:
                self._hand(sub, None)

    @property
    def seq(self) -> int:
        """Up to where the history holds every change: moved on only with the events it read
        (the reader's own sequence runs ahead while a look is building them, and a stream
        subscribed then would be told "up to here" before it has them)."""
        with self._lock:
            return self._seq

    def catch_up(self) -> None:
        """Look now (a new stream calls it, in a thread, before it subscribes): while no stream
        was open, the history may be up to `idle` seconds behind the store. A store briefly
        unavailable does not refuse the stream: the thread looks again once it is open."""
        try:
            with self._looking:
                self._look()
        except Exception:
            log.warning("watch broadcaster failed to read the change feed for a new stream", exc_info=True)

    def subscribe(self, since: int | None) -> Subscription:
        """Events after `since` (None: from now), the history's first; Expired when `since`
        is older than the history."""
        with self._lock:
            start = self._seq if since is None else since
            if start < self._floor:
                raise Expired(
                    f"too old resource version: {start} (the oldest this server can watch from is {self._floor})"
                )
            sub = Subscription(start, asyncio.get_running_loop())
            sub.backlog = Batch([e for e in self._history if e.resource_version > start], max(start, self._seq))
            self._subscriptions.append(sub)
        self._streams_came.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

    def _run(self) -> None:
        assert self._reader is not None
        while True:
            with self._lock:
                watched = bool(self._subscriptions)
            if watched:
                self._reader.wait(self.interval)  # woken by the store's notifications, else the poll
            else:
                self._streams_came.wait(self.idle)
                self._streams_came.clear()  # a stream that came meanwhile is seen by the next turn's check
            if self._stop.is_set():
                return
            try:
                with self._looking:
                    self._look()
            except Exception:  # the store may be briefly unavailable; the next look tries again
                log.warning("watch broadcaster failed to read the change feed", exc_info=True)
                self._stop.wait(0.5)

    def _look(self) -> None:
        assert self._reader is not None
        changes = self._reader.look()
        events = [e for o in changes.written for e in self._written(o)]
        events += [e for kind, name, rv in changes.deleted if (e := self._deleted(kind, name, rv)) is not None]
        if not events:
            with self._lock:
                self._seq = max(self._seq, changes.seq)
            return
        events.sort(key=lambda e: e.resource_version)
        batch = Batch(events, changes.seq)
        with self._lock:
            self._history.extend(events)
            self._seq = max(self._seq, changes.seq)
            while len(self._history) > self._history_size:
                self._floor = max(self._floor, self._history.popleft().resource_version)
            for sub in self._subscriptions:
                self._hand(sub, batch)

    def _hand(self, sub: Subscription, batch: Batch | None) -> None:
        """Give a batch to a stream (None: the end); a stream too far behind is ended instead."""
        if sub.ended:
            return
        if batch is not None and sub.queue.qsize() >= BACKLOG:  # read across threads: a close enough count
            batch, sub.ended = None, True
        try:
            sub.loop.call_soon_threadsafe(sub.queue.put_nowait, batch)
        except RuntimeError:  # its loop is closed: the server is going down
            sub.ended = True

    def _written(self, obj: StoredObject) -> list[Event]:
        key = (obj.kind, obj.name)
        known = self._known.get(key)
        events = []
        if known is not None and known.uid != obj.uid:  # deleted and made again since the last look
            # said at the new object's creation: a stream from after it knows only the new one
            events.append(self._tombstone(obj.kind, obj.name, known, obj.created_rv or obj.resource_version))
            known = None
        elif known is not None and obj.resource_version <= known.resource_version:
            return []  # seen already: the feed names an object again when it moved on after a look
        self._known[key] = _Known(obj.uid, obj.labels, obj.resource_version, obj.created_rv)
        kind = "ADDED" if known is None else "MODIFIED"
        events.append(
            Event(
                obj.resource_version,
                kind,
                obj.kind,
                obj.name,
                obj,
                obj.labels,
                None if known is None else known.labels,
                obj.created_rv,
            )
        )
        return events

    def _deleted(self, kind: str, name: str, rv: int) -> Event | None:
        known = self._known.pop((kind, name), None)
        return None if known is None else self._tombstone(kind, name, known, rv)

    @staticmethod
    def _tombstone(kind: str, name: str, known: _Known, rv: int) -> Event:
        metadata: dict[str, Any] = {"name": name, "uid": known.uid, "resourceVersion": str(rv)}
        if known.labels:
            metadata["labels"] = known.labels
        document = {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata}
        return Event(rv, "DELETED", kind, name, document, known.labels, known.labels, known.created_rv)


def as_of(event: Event, since: int) -> Event:
    """The event as a stream from resourceVersion `since` calls it: ADDED when the object was
    created after `since`, else MODIFIED (the broadcaster's own word depends on when it
    looked). An object that existed at `since` but that the broadcaster had not seen before
    this change is taken to have had the labels it has now."""
    if event.type == "DELETED":
        return event
    kind = "ADDED" if event.created_rv > since else "MODIFIED"
    if kind == event.type and (kind == "ADDED" or event.old_labels is not None):
        return event
    before = None if kind == "ADDED" else (event.old_labels if event.old_labels is not None else event.labels)
    return dataclasses.replace(event, type=kind, old_labels=before)


def seen_as(event: Event, selector: list[Requirement] | None) -> str | None:
    """What a stream with a label selector calls this event, as Kubernetes does: an object that
    comes to match is ADDED, one that stops matching DELETED; None when it never matched."""
    if not selector:
        return event.type
    now = matches(selector, event.labels)
    before = event.old_labels is not None and matches(selector, event.old_labels)
    if event.type == "DELETED":
        return "DELETED" if now else None
    if event.type == "ADDED":
        return "ADDED" if now else None
    if now:
        return "MODIFIED" if before else "ADDED"
    return "DELETED" if before else None


async def stream(
    broadcaster: Broadcaster,
    sub: Subscription,
    kind: str,
    selector: list[Requirement] | None,
    skip: dict[str, int],
) -> AsyncIterator[Event | int | None]:
    """The events of one kind a stream shows, after its resourceVersion, each batch followed by
    its bookmark (an int: every change up to it was sent); `skip`: name -> resourceVersion the
    client has already (the listing sent first). None: the stream was ended because it fell
    behind (the caller reports 410). A change is told as of what the stream has told: every
    change up to its last bookmark (from its resourceVersion on), and the listing."""
    try:
        told = sub.since  # every change up to here is the client's
        # within a batch, the change of each object (name and uid) told last: the backlog
        # replayed from history is one batch, and an object's second change in it is told as
        # of its first (MODIFIED, not ADDED again; DELETED once it stops matching the
        # selector). By uid: an object made again under a name is told ADDED, though its
        # creation shares a resourceVersion with the DELETED of the one before
        told_of: dict[tuple[str, str], int] = {}
        batch: Batch | None = sub.backlog
        while batch is not None:
            for given in batch.events:
                after = max(told, skip.get(given.name, 0))
                if given.kind != kind or given.resource_version <= after:
                    continue
                key = (given.name, given.uid)
                event = as_of(given, max(after, told_of.get(key, 0)))
                told_of[key] = given.resource_version
                if (seen := seen_as(event, selector)) is not None:
                    yield event if seen == event.type else dataclasses.replace(event, type=seen)
            told = max(told, batch.seq)
            told_of.clear()
            yield batch.seq
            batch = await sub.queue.get()
        if sub.ended:
            yield None
    finally:
        broadcaster.unsubscribe(sub)


async def watch_lines(
    broadcaster: Broadcaster,
    store: Store,
    info: KindInfo,
    selector: list[Requirement] | None,
    since: int | None,
    timeout: float | None,
    bookmarks: bool,
    secrets: bool = True,
) -> AsyncIterator[str]:
    """The JSON lines of one watch; 410 as an ERROR event when the client is too far behind;
    with `bookmarks`, a BOOKMARK after each batch of changes (its resourceVersion: watch again
    from there and nothing is missed); without `secrets`, passwords in URLs as ***."""
    shown: Callable[[dict[str, Any]], dict[str, Any]] = (lambda d: d) if secrets else without_secrets
    skip: dict[str, int] = {}
    if (refused := await _too_new(store, since)) is not None:
        yield refused
        return
    await anyio.to_thread.run_sync(broadcaster.catch_up)
    try:
        sub = broadcaster.subscribe(since)
    except Expired as exc:
        yield _line("ERROR", status(410, str(exc)))
        return
    if since is None:  # Kubernetes' "most recent": what exists now, as ADDED, then the changes
        listing = await anyio.to_thread.run_sync(objects, store, info.plural, [], selector)
        for o in listing.objects:
            skip[o.name] = o.resource_version
            yield _line("ADDED", shown(o.manifest()))
    with anyio.move_on_after(timeout if timeout is not None else math.inf):
        async for event in stream(broadcaster, sub, info.kind, selector, skip):
            if event is None:
                yield _line("ERROR", status(410, "this watch fell too far behind; list and watch again"))
                return
            if isinstance(event, int):
                if bookmarks:
                    bookmark = {
                        "kind": info.kind,
                        "apiVersion": API_VERSION,
                        "metadata": {"resourceVersion": str(event)},
                    }
                    yield _line("BOOKMARK", bookmark)
                continue
            yield _line(event.type, shown(event.document))


async def event_lines(
    store: Store, newest: Callable[[int], list[Any]], limit: int, since: int | None, timeout: float | None
) -> AsyncIterator[str]:
    """One events watch: ADDED for each event of the newest `limit` (with `since`, only those
    recorded after that resourceVersion), then for each new one, looked for every EVENT_POLL
    (events are not in the change feed the object watches follow). A version the store has
    not reached is refused at once, as an object watch refuses it; one with more than `limit`
    events after it is 410, as a compacted version is: the client would miss the ones between."""
    if (refused := await _too_new(store, since)) is not None:
        yield refused
        return
    first = await anyio.to_thread.run_sync(newest, limit + 1)
    if since is not None and len(first) > limit and first[0].resource_version > since:
        yield _line("ERROR", status(410, f"more than {limit} events after resourceVersion {since}; list again"))
        return
    first = first[-limit:]
    new = NewEvents(first)
    for row in first:
        if since is None or row.resource_version > since:
            yield _line("ADDED", event_doc(row))
    with anyio.move_on_after(timeout if timeout is not None else math.inf):
        while True:
            await anyio.sleep(EVENT_POLL)
            fresh = new.among(await anyio.to_thread.run_sync(newest, limit + 1))
            if len(fresh) > limit:  # more were recorded in one look than a page holds
                yield _line("ERROR", status(410, f"more than {limit} events in {EVENT_POLL:g}s; list again"))
                return
            for row in fresh:
                yield _line("ADDED", event_doc(row))


async def _too_new(store: Store, since: int | None) -> str | None:
    """The ERROR line for a version the store has not reached (of another store, or of this
    one before it was replaced: nothing would ever come after it), as Kubernetes' "Too large
    resource version" (504): list again. None for a version it has reached."""
    if since is None or since <= (current := await anyio.to_thread.run_sync(store.change_seq)):
        return None
    return _line("ERROR", status(504, f"too large resource version: {since} (the store is at {current})"))


def _line(kind: str, document: dict[str, Any]) -> str:
    return json.dumps({"type": kind, "object": document}, separators=(",", ":")) + "\n"
