"""The verbs on a store in this process: each method is the verb function itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..apply import Change, Deleted
    from ..commands import Drained, OneOff
    from ..converge import Converged, Until, WaitResult
    from ..drain import HeldRun
    from ..graph import Graph
    from ..manifests import Loaded, Manifest
    from ..reads import Listing
    from ..runlogs import RunLogs
    from ..selectors import Requirement
    from ..store import Store, StoredObject
    from ..watching import WatchEvent


def _parsed(selector: str | None) -> list[Requirement] | None:
    from ..selectors import parse

    return parse(selector) if selector else None


class LocalClient:
    def __init__(self, store: Store):
        self.store = store

    def apply(
        self, loaded: Loaded, *, dry_run: bool = False, force: bool = False, prune: bool = False, selector: str | None
    ) -> list[Change]:
        from ..apply import apply_manifests

        return apply_manifests(
            self.store, loaded, dry_run=dry_run, force=force, prune=prune, selector=_parsed(selector)
        )

    def delete(self, targets: list[tuple[str, str]], *, kind: str | None, selector: str | None) -> Deleted:
        from ..apply import delete

        return delete(self.store, targets, kind=kind, selector=_parsed(selector))

    def objects(self, kind: str, names: list[str], selector: str | None, *, strict: bool = True) -> Listing:
        from ..reads import objects

        return objects(self.store, kind, names, _parsed(selector), strict=strict)

    def events(self, names: list[str]) -> list[Any]:
        from ..reads import events

        return events(self.store, names)

    def describe(self, kind: str, name: str) -> tuple[StoredObject, list[Any]]:
        from ..reads import describe

        return describe(self.store, kind, name)

    def watch(self, kind: str, names: list[str], selector: str | None) -> tuple[Listing, Iterator[WatchEvent]]:
        from ..watching import watch

        return watch(self.store, kind, names, _parsed(selector))

    def run_logs(self, name: str, run: int | None) -> RunLogs:
        from ..runlogs import run_logs

        return run_logs(self.store, name, run)

    def cancel(self, name: str, *, by: str | None = None) -> str:
        from ..commands import cancel

        return cancel(self.store, name, by=by)

    def set_suspend(self, name: str, suspend: bool) -> str:
        from ..commands import set_suspend

        return set_suspend(self.store, name, suspend)

    def rerun(self, name: str, *, downstream: bool) -> str:
        from ..commands import rerun

        return rerun(self.store, name, downstream=downstream)

    def set_unschedulable(self, name: str, unschedulable: bool) -> str:
        from ..commands import set_unschedulable

        return set_unschedulable(self.store, name, unschedulable)

    def drain(self, name: str, *, force: bool) -> Drained:
        from ..commands import drain

        return drain(self.store, name, force=force)

    def wait_drained(
        self, names: list[str], timeout: float | None, on_change: Callable[[list[HeldRun]], None]
    ) -> list[HeldRun]:
        from ..drain import wait_drained

        return wait_drained(self.store, names, timeout, on_change)

    def rerun_failed(self, selector: str | None) -> list[str]:
        from ..commands import rerun_failed

        return rerun_failed(self.store, _parsed(selector))

    def rerun_selected(self, selector: str, *, downstream: bool) -> list[str]:
        from ..commands import rerun_selected

        return rerun_selected(self.store, _parsed(selector) or [], downstream=downstream)

    def run_job(self, one_off: OneOff) -> str:
        from ..commands import run_job

        return run_job(self.store, one_off)

    def wait_for(self, names: list[str], condition: str, timeout: float, selector: str | None) -> WaitResult:
        from ..converge import wait_for

        return wait_for(self.store, names, condition, timeout, selector=_parsed(selector))

    def stored_graph(self, selector: str | None) -> Graph:
        from ..graph import stored_graph

        return stored_graph(self.store, _parsed(selector))

    def manifest_graph(self, manifests: list[Manifest]) -> Graph:
        from ..graph import manifest_graph

        return manifest_graph(self.store, manifests)

    def converge(self, names: list[str], until: Until) -> Converged:
        """A controller runs in this process meanwhile (`up`, `run --wait`)."""
        from ..converge import converge

        return converge(self.store, names, until)

    def close(self) -> None:
        """Release the store's connections when the verb is done (SQLite checkpoints and
        removes its -wal file on the last close), not whenever the interpreter gets to them."""
        self.store.dispose()
