"""The watch broadcaster: what a stream with a label selector calls each change, and a
resourceVersion older than the kept history answered as expired (410), not silently."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from reconciler.apply import apply_manifests
from reconciler.manifests import documents
from reconciler.selectors import parse
from reconciler.server.watch import Broadcaster, Event, Expired, as_of, seen_as
from reconciler.store import Store
from tests.helpers import wait_until
from tests.server.conftest import job_manifest


def _event(kind: str, now: dict, before: dict | None) -> Event:
    return Event(1, kind, "Job", "a", {}, now, before)


@pytest.mark.parametrize(
    ("kind", "now", "before", "seen"),
    [
        ("ADDED", {"t": "x"}, None, "ADDED"),
        ("ADDED", {"t": "y"}, None, None),
        ("MODIFIED", {"t": "x"}, {"t": "x"}, "MODIFIED"),
        ("MODIFIED", {"t": "x"}, {"t": "y"}, "ADDED"),  # came to match
        ("MODIFIED", {"t": "y"}, {"t": "x"}, "DELETED"),  # left the selection
        ("MODIFIED", {"t": "y"}, {"t": "z"}, None),
        ("DELETED", {"t": "x"}, {"t": "x"}, "DELETED"),
        ("DELETED", {"t": "y"}, {"t": "y"}, None),
    ],
)
def test_what_a_selecting_stream_calls_each_change(kind, now, before, seen):
    assert seen_as(_event(kind, now, before), parse("t=x")) == seen
    assert seen_as(_event(kind, now, before), None) == kind


def test_a_resource_version_older_than_the_history_is_expired(sqlite_url):
    store = Store(sqlite_url)
    broadcaster = Broadcaster(store, history=2, interval=0.01).start()
    try:
        start = broadcaster.seq
        for name in ("a", "b", "c", "d"):
            apply_manifests(store, documents([job_manifest(name)], Path.cwd()))
        latest = store.change_seq()
        wait_until(lambda: broadcaster.seq >= latest, message="the broadcaster caught up")

        async def subscribe(since: int):
            return broadcaster.subscribe(since)

        with pytest.raises(Expired, match="too old resource version"):
            asyncio.run(subscribe(start))
        recent = asyncio.run(subscribe(latest - 1))
        assert [(e.name, e.type) for e in recent.backlog.events] == [("d", "ADDED")]
    finally:
        broadcaster.stop()
        store.dispose()


def test_a_stream_subscribed_while_a_look_is_under_way_is_not_told_of_changes_it_lacks(sqlite_url):
    # the look is held after it has read the feed and before its events reach the history:
    # the window in which the reader's own sequence is ahead of what a stream can be given
    store = Store(sqlite_url)
    broadcaster = Broadcaster(store, history=100, interval=0.01).start()
    reached, go_on = threading.Event(), threading.Event()
    written = broadcaster._written

    def held(obj):
        reached.set()
        go_on.wait(10)
        return written(obj)

    broadcaster._written = held
    try:
        start = broadcaster.seq
        apply_manifests(store, documents([job_manifest("a")], Path.cwd()))
        assert reached.wait(10), "the broadcaster did not look"

        async def subscribe():
            return broadcaster.subscribe(start)

        early = asyncio.run(subscribe())
        # a bookmark is "every change up to here is given": nothing was given yet
        assert early.backlog.events == []
        assert early.backlog.seq == start
        go_on.set()
        wait_until(lambda: broadcaster.seq > start, message="the look ended")
        late = asyncio.run(subscribe())
        assert [(e.name, e.type) for e in late.backlog.events] == [("a", "ADDED")]
        assert late.backlog.seq == broadcaster.seq
    finally:
        go_on.set()
        broadcaster.stop()
        store.dispose()


def test_with_no_stream_open_the_broadcaster_waits_and_a_new_stream_catches_it_up(sqlite_url):
    # the witness has a stream open and looks after every commit; the idle one (a period of
    # an hour) does not look until a stream comes, which has it look first
    store = Store(sqlite_url)
    idle = Broadcaster(store, interval=0.01, idle=3600).start()
    witness = Broadcaster(store, interval=0.01).start()

    async def subscribe(broadcaster: Broadcaster, since: int):
        return broadcaster.subscribe(since)

    try:
        start = idle.seq
        asyncio.run(subscribe(witness, start))
        for name in ("a", "b"):
            apply_manifests(store, documents([job_manifest(name)], Path.cwd()))
        latest = store.change_seq()
        wait_until(lambda: witness.seq >= latest, message="the watched broadcaster caught up")
        assert idle.seq == start, "a broadcaster nobody watches looked after a commit"
        idle.catch_up()
        assert idle.seq >= latest
        stream = asyncio.run(subscribe(idle, start))
        assert [(e.name, e.type) for e in stream.backlog.events] == [("a", "ADDED"), ("b", "ADDED")]
        apply_manifests(store, documents([job_manifest("c")], Path.cwd()))
        latest = store.change_seq()
        wait_until(lambda: idle.seq >= latest, message="with a stream open, the broadcaster looks after a commit")
    finally:
        idle.stop()
        witness.stop()
        store.dispose()


def test_a_stream_calls_a_change_by_when_the_object_was_created_not_by_when_the_broadcaster_looked():
    # the broadcaster first saw "a" with this change (ADDED to it), but "a" was created at 5
    created = Event(9, "ADDED", "Job", "a", {}, {"t": "x"}, None, created_rv=5)
    assert as_of(created, 4).type == "ADDED"  # a stream from before the creation
    modified = as_of(created, 7)  # a stream from after it: the object existed then
    assert modified.type == "MODIFIED" and modified.old_labels == {"t": "x"}
    assert seen_as(modified, parse("t=x")) == "MODIFIED"  # matched then (as far as can be known) and now
    # seen before by the broadcaster: its labels at that look decide the selector's word
    relabelled = Event(9, "MODIFIED", "Job", "a", {}, {"t": "x"}, {"t": "y"}, created_rv=5)
    assert as_of(relabelled, 7) is relabelled and seen_as(relabelled, parse("t=x")) == "ADDED"
    assert as_of(relabelled, 3).type == "ADDED"
    gone = Event(9, "DELETED", "Job", "a", {}, {"t": "x"}, {"t": "x"}, created_rv=5)
    assert as_of(gone, 7) is gone


def test_a_new_stream_is_not_refused_while_the_store_cannot_be_read(sqlite_url):
    from reconciler.store.dbapi import StoreError

    store = Store(sqlite_url)
    broadcaster = Broadcaster(store, interval=0.01, idle=3600).start()
    reader = broadcaster._reader
    look = reader.look
    failing = [True]

    def unavailable():
        if failing[0]:
            raise StoreError("database is locked")
        return look()

    reader.look = unavailable

    async def subscribe(since: int):
        return broadcaster.subscribe(since)

    try:
        start = broadcaster.seq
        apply_manifests(store, documents([job_manifest("a")], Path.cwd()))
        broadcaster.catch_up()  # said in the log, not raised
        stream = asyncio.run(subscribe(start))
        assert stream.backlog.events == []
        failing[0] = False  # the store answers again: the open stream's broadcaster looks
        latest = store.change_seq()
        wait_until(lambda: broadcaster.seq >= latest, message="the broadcaster looked once the store answered")
    finally:
        broadcaster.stop()
        store.dispose()


def test_an_object_deleted_and_made_again_between_two_looks_is_told_deleted_then_added(sqlite_url):
    """The DELETED of the one before and the creation of the new one share a resourceVersion
    (the broadcaster learns of both at one look): a stream replayed from before tells both,
    the new one as ADDED, or its client would lose an object that exists."""
    from reconciler.apply import delete
    from reconciler.server.watch import stream

    store = Store(sqlite_url)
    broadcaster = Broadcaster(store, interval=0.01, idle=3600).start()
    try:
        start = broadcaster.seq
        apply_manifests(store, documents([job_manifest("a", suspend=True)], Path.cwd()))
        broadcaster.catch_up()
        delete(store, [("Job", "a")])
        apply_manifests(store, documents([job_manifest("a", suspend=True)], Path.cwd()))
        broadcaster.catch_up()

        async def told() -> list[tuple[str, str]]:
            sub = broadcaster.subscribe(start)
            seen = []
            async for event in stream(broadcaster, sub, "Job", None, {}):
                if isinstance(event, int):  # the backlog's bookmark: all of it was told
                    return seen
                assert event is not None
                seen.append((event.type, event.uid))
            return seen

        events = asyncio.run(told())
        assert [t for t, _ in events] == ["ADDED", "DELETED", "ADDED"], events
        assert events[0][1] == events[1][1] != events[2][1]  # the first object, then the new one
    finally:
        broadcaster.stop()
        store.dispose()
