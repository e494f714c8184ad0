"""`get -w` prints the listing its watch starts from: no read of its own before it (a change
made between two reads would be in neither what was printed nor what followed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import apply_manifests
from reconciler.cli.listing import watch_listing
from reconciler.client.local import LocalClient
from reconciler.manifests import documents
from reconciler.store import Store
from tests.server.conftest import job_manifest


class _OneRead(LocalClient):
    """The store's own client, but a listing read anywhere but the watch fails the test, and
    the watch's changes end at once (so the verb returns)."""

    def objects(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("get -w read a listing of its own besides the watch's")

    def watch(self, kind: str, names: list[str], selector: str | None) -> Any:
        listing, _ = super().watch(kind, names, selector)
        return listing, iter(())


@pytest.mark.parametrize("events", [False, True])
def test_get_watch_prints_the_listing_its_watch_starts_from(sqlite_url, capsys, events):
    store = Store(sqlite_url)
    try:
        apply_manifests(store, documents([job_manifest("listed", suspend=True)], Path.cwd()))
        watch_listing(_OneRead(store), "jobs", [], None, None, events)
        rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
        assert rows == (
            [["EVENT", "NAME"], ["ADDED", "listed"]] if events else [["NAME", "STATUS"], ["listed", "Suspended"]]
        )
    finally:
        store.dispose()
