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
from reconciler.server.watch import Broadcaster, Event, Expired, seen_as
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
