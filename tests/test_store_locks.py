"""SQLite's locks are POSIX locks, which belong to the process and vanish when it closes any
descriptor of the file. A second Store on the same file in one process (the controller's
and `controller --watch`'s folder client) must not open the file itself: the first Store's
connections would lose their locks, the next process to close its last connection would
take itself for the last one and delete the -wal file, and the first Store would go on
committing into an unlinked WAL that no other process can see."""

from __future__ import annotations

from reconciler.store import Store
from reconciler.store import repository as repo
from tests.helpers import run_cli


def test_a_second_store_on_one_file_leaves_the_first_ones_writes_visible(sqlite_url):
    first = Store(sqlite_url)
    second = None
    try:
        with first.write() as tx:  # the first store holds open connections, in WAL mode
            repo.create(tx, kind="Pool", name="before", spec={"slots": 1}, labels={}, annotations={})
        second = Store(sqlite_url)
        # another process opens and closes the store: with the first store's locks gone it
        # would checkpoint and delete the -wal file as the last connection
        assert run_cli("get", "pools", store=sqlite_url).code == 0
        with first.write() as tx:
            repo.create(tx, kind="Pool", name="after", spec={"slots": 1}, labels={}, annotations={})
        seen = run_cli("get", "pools", "-o", "name", store=sqlite_url)
        assert seen.stdout.split() == ["pool.reconciler.dev/after", "pool.reconciler.dev/before"], seen
    finally:
        first.dispose()
        if second is not None:
            second.dispose()
