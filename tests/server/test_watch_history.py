"""The watch broadcaster: what a stream with a label selector calls each change, and a
resourceVersion older than the kept history answered as expired (410), not silently."""

from __future__ import annotations

import asyncio
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
