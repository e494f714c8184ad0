"""The verbs through a running `reconciler serve` (`--server URL`): each method asks the HTTP
API and answers what the verb function would have, so the CLI prints the same.

What runs where: manifests are read and validated here (their problems name file and line,
as locally); the server validates the whole set against its store, and its answers name
`items[N].field`, which are put back as `file:line: field` of manifest N. `up` and `wait`
follow the server's watch stream; the server's controller does the work."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from ..api.kinds import resolve_kind
from ..api.meta import dump
from ..errors import Conflict, InvalidInput, NotFound
from ..selectors import parse
from ..wire import (
    PREFIX,
    RunRequest,
    change_from,
    deleted_from,
    event_from,
    graph_from,
    object_from,
)
from .http import Http
from .informer import Informer, Relist, changes, list_objects
from .placed import about_refused, relocate

if TYPE_CHECKING:
    from ..api.status import JobStatusDict
    from ..apply import Change, Deleted
    from ..commands import Drained, OneOff
    from ..converge import Converged, Until, WaitResult, Watched
    from ..drain import HeldRun
    from ..graph import Graph
    from ..manifests import Loaded, Manifest
    from ..reads import Listing
    from ..selectors import Requirement
    from ..store import StoredObject
    from ..watching import WatchEvent

NAMED_GETS = 16  # up to this many names are fetched one by one; more, in one list
EVENTS_LIMIT = 1000  # as reads.events
DRAIN_LOOK = 0.5  # seconds between looks at what a drained node still holds


class RemoteClient:
    def __init__(self, server: str, token: str | None):
        self.http = Http(server, token)

    def close(self) -> None:
        self.http.close()

    # -- apply, delete ---------------------------------------------------------------------

    def apply(
        self, loaded: Loaded, *, dry_run: bool = False, force: bool = False, prune: bool = False, selector: str | None
    ) -> list[Change]:
        _parsed(selector)  # a bad selector is refused here, as locally, before anything is sent
        manifests = loaded.manifests
        body = {
            "items": [dump(m.obj) for m in manifests],
            "dryRun": dry_run or bool(loaded.problems),
            "prune": prune,
            "labelSelector": selector or "",
            "force": force,
        }
        if loaded.problems:  # reported with the server's own checks of the rest, as locally
            found: list[str] = []
            if manifests:
                try:
                    self.http.call("POST", f"{PREFIX}/apply", body=body)
                except InvalidInput as exc:
                    found = [p for p in exc.problems if not about_refused(p, manifests, loaded.refused)]
            raise _invalid(loaded.problems + [relocate(p, manifests) for p in found])
        try:
            answer = self.http.call("POST", f"{PREFIX}/apply", body=body)
        except InvalidInput as exc:
            raise _invalid([relocate(p, manifests) for p in exc.problems]) from None
        except Conflict as exc:
            raise Conflict(relocate(str(exc), manifests)) from None
        return [change_from(d) for d in answer["items"]]

    def delete(self, targets: list[tuple[str, str]], *, kind: str | None, selector: str | None) -> Deleted:
        _parsed(selector)
        body = {"items": [{"kind": k, "name": n} for k, n in targets], "kind": kind, "labelSelector": selector or ""}
        return deleted_from(self.http.call("POST", f"{PREFIX}/delete", body=body))

    # -- reads -----------------------------------------------------------------------------

    def objects(self, kind: str, names: list[str], selector: str | None, *, strict: bool = True) -> Listing:
        from ..reads import SERVICES, service_object

        requirements = _parsed(selector)
        if kind.lower() in SERVICES:  # the registry: derived by the server, as reads derives it
            registry = [service_object(entry) for entry in self.http.call("GET", "/services")]
            return _listing(kind, registry, names, requirements, strict)
        plural = resolve_kind(kind).plural
        if names and len(set(names)) <= NAMED_GETS:
            found = [o for n in sorted(set(names)) if (o := self._get(plural, n)) is not None]
        else:
            found = list_objects(self.http, plural)[1]
        return _listing(kind, found, names, requirements, strict)

    def _get(self, plural: str, name: str) -> StoredObject | None:
        try:
            return object_from(self.http.call("GET", f"{PREFIX}/{plural}/{name}"))
        except NotFound:
            return None

    def events(self, names: list[str]) -> list[Any]:
        rows = self._events(limit=EVENTS_LIMIT)
        return [r for r in rows if r.name in names] if names else rows

    def _events(self, *, limit: int, of: tuple[str, str] | None = None) -> list[Any]:
        fields = f"involvedObject.kind={of[0]},involvedObject.name={of[1]}" if of else None
        document = self.http.call("GET", f"{PREFIX}/events", params={"fieldSelector": fields, "limit": limit})
        return [event_from(d) for d in document["items"]]

    def describe(self, kind: str, name: str) -> tuple[StoredObject, list[Any]]:
        from ..reads import DESCRIBED_EVENTS

        info = resolve_kind(kind)
        obj = object_from(self.http.call("GET", f"{PREFIX}/{info.plural}/{name}"))
        events = self._events(limit=DESCRIBED_EVENTS, of=(info.kind, name))
        return obj, [e for e in events if e.uid == obj.uid]  # not those of an earlier object of the name

    def watch(self, kind: str, names: list[str], selector: str | None) -> tuple[Listing, Iterator[WatchEvent]]:
        """As watching.watch: the selected objects (a missing name in the listing's
        `missing`), then each of them again whenever it changes after that listing, and each
        one deleted or leaving the selection: the server's watch stream from the list's
        resourceVersion."""
        from ..reads import SERVICES
        from ..watching import DERIVED_STATUS

        service = kind.lower() in SERVICES
        if not service and resolve_kind(kind).kind in DERIVED_STATUS:
            listed = self.objects(kind, names, selector, strict=False)
            return listed, self._relisting(kind, names, selector, listed)
        plural = "jobs" if service else resolve_kind(kind).plural
        since, every = list_objects(self.http, plural)
        # a service's entry is derived by the server: read after the list's resourceVersion,
        # so a change between the two comes again on the stream (told only if it shows)
        listing = (
            self.objects(kind, names, selector, strict=False)
            if service
            else _listing(kind, every, names, _parsed(selector), False)
        )
        return listing, self._following(kind, names, selector, plural, since, listing, service)

    def _following(
        self,
        kind: str,
        names: list[str],
        selector: str | None,
        plural: str,
        since: int,
        listing: Listing,
        service: bool,
    ) -> Iterator[WatchEvent]:
        from ..watching import Seen

        seen = Seen(listing.objects)

        def again() -> list[StoredObject]:  # the selection as the server shows it now
            return self.objects(kind, names, selector, strict=False).objects

        while True:
            try:
                for event, obj in changes(self.http, plural, since, selector):
                    if event == "OPEN":
                        continue
                    if event == "BOOKMARK":
                        since = obj
                    elif service:  # a job changed: the registry, derived by the server, again
                        yield from seen.changes(again())
                    elif not names or obj.name in names:
                        yield from seen.one(event, obj)
            except Relist:
                since, _ = list_objects(self.http, plural, selector)
                yield from seen.changes(again())

    def _relisting(self, kind: str, names: list[str], selector: str | None, listed: Listing) -> Iterator[WatchEvent]:
        """Pools, nodes and notifiers, whose shown status the server derives when it answers
        (usage, readiness, delivery counts), listed again on a timer as watching.watch looks
        again: a watch stream only carries writes. There are few of them; a list is cheap."""
        from ..watching import DERIVED_LOOK, Seen

        seen = Seen(listed.objects)
        while True:
            time.sleep(DERIVED_LOOK)  # a CLI follower: a timer is what it waits for
            yield from seen.changes(self.objects(kind, names, selector, strict=False).objects)

    def run_logs(self, name: str, run: int | None) -> RemoteLogs:
        return RemoteLogs(self.http, name, run)

    # -- controls --------------------------------------------------------------------------

    def _act(self, name: str, action: str, **params: Any) -> str:
        return str(self.http.call("POST", f"{PREFIX}/jobs/{name}/{action}", params=params)["message"])

    def cancel(self, name: str, *, by: str | None = None) -> str:
        return self._act(name, "cancel", requestedBy=by)

    def set_suspend(self, name: str, suspend: bool) -> str:
        return self._act(name, "suspend" if suspend else "resume")

    def rerun(self, name: str, *, downstream: bool) -> str:
        return self._act(name, "rerun", downstream=downstream)

    def set_unschedulable(self, name: str, unschedulable: bool) -> str:
        action = "cordon" if unschedulable else "uncordon"
        return str(self.http.call("POST", f"{PREFIX}/nodes/{name}/{action}")["message"])

    def drain(self, name: str, *, force: bool) -> Drained:
        from ..commands import Drained

        done = self.http.call("POST", f"{PREFIX}/nodes/{name}/drain", params={"force": force})
        return Drained(name, str(done["cordoned"]), [(str(j), int(n)) for j, n in done["declaredLost"]])

    def wait_drained(
        self, names: list[str], timeout: float | None, on_change: Callable[[list[HeldRun]], None]
    ) -> list[HeldRun]:
        """As drain.wait_drained, by asking the server what still holds slots there on a
        timer (a drain is an operator's wait of seconds to minutes: a look every 0.5 s)."""
        from ..drain import HeldRun

        def look() -> list[HeldRun]:
            items = [self.http.call("GET", f"{PREFIX}/nodes/{n}/held")["items"] for n in names]
            return [HeldRun(**item) for found in items for item in found]

        deadline = None if timeout is None else time.monotonic() + timeout
        held = look()
        on_change(held)
        while held:
            if deadline is not None and time.monotonic() >= deadline:
                return held
            time.sleep(DRAIN_LOOK)
            if (now := look()) != held:
                held = now
                on_change(held)
        return held

    def rerun_failed(self, selector: str | None) -> list[str]:
        _parsed(selector)
        params = {"failed": True, "labelSelector": selector}
        return list(self.http.call("POST", f"{PREFIX}/rerun", params=params)["names"])

    def rerun_selected(self, selector: str, *, downstream: bool) -> list[str]:
        _parsed(selector)
        params = {"labelSelector": selector, "downstream": downstream}
        return list(self.http.call("POST", f"{PREFIX}/rerun", params=params)["names"])

    def run_job(self, one_off: OneOff) -> str:
        body = RunRequest.of(one_off).model_dump(by_alias=True, exclude_none=True)
        return str(self.http.call("POST", f"{PREFIX}/run", body=body)["metadata"]["name"])

    # -- following -------------------------------------------------------------------------

    def wait_for(self, names: list[str], condition: str, timeout: float, selector: str | None) -> WaitResult:
        from ..converge import wait_states, wait_until

        requirements = _parsed(selector)
        jobs = Informer(self.http, "jobs")
        try:

            def look() -> WaitResult:
                chosen = sorted((o for o in jobs.objects.values() if not names or o.name in names), key=_name)
                return wait_states(chosen, jobs.objects.get, names, condition, requirements)

            result = wait_until(look, lambda: bool(jobs.poll()), timeout)
            if result.names("pending") and jobs.failure is not None:
                # the wait ran out while the server could not be reached: that is the news,
                # not a condition that was never met
                raise jobs.failure
            return result
        finally:
            jobs.close()

    def converge(self, names: list[str], until: Until) -> Converged:
        """Follow the named jobs through the server's watch stream while its controller works;
        on a timeout, Ctrl-C or --fail-fast, cancel what is not done through the API."""
        from ..converge import follow, longest_grace

        jobs = Informer(self.http, "jobs")
        try:
            return follow(
                _JobWatch(jobs, names),
                cancel=lambda name, by: self.cancel(name, by=by),
                grace=lambda chosen: longest_grace([jobs.objects[n].spec for n in chosen if n in jobs.objects]),
                until=until,
            )
        finally:
            jobs.close()

    # -- graph -----------------------------------------------------------------------------

    def stored_graph(self, selector: str | None) -> Graph:
        _parsed(selector)
        return graph_from(self.http.call("GET", f"{PREFIX}/graph", params={"labelSelector": selector}))

    def manifest_graph(self, manifests: list[Manifest]) -> Graph:
        body = {"items": [dump(m.obj) for m in manifests]}
        return graph_from(self.http.call("POST", f"{PREFIX}/graph", body=body))


class RemoteLogs:
    """A run's logs through the API; the request is made when they are read (errors at once)."""

    def __init__(self, http: Http, name: str, run: int | None):
        self.http, self.name, self.run = http, name, run

    def _pieces(self, stream: str | None, tail: int | None, follow: bool) -> Iterator[str]:
        params = {"run": self.run, "stream": stream, "tailLines": tail, "follow": follow or None}
        return self.http.text(f"{PREFIX}/jobs/{self.name}/log", params)

    def read(self, stream: str | None, tail: int | None = None) -> Iterator[str]:
        return self._pieces(stream, tail, False)

    def follow(self, stream: str | None, tail: int | None = None) -> Iterator[str]:
        return self._pieces(stream, tail, True)


class _JobWatch:
    """converge.Follower over an informer of the server's jobs (what JobWatch is on a store)."""

    def __init__(self, jobs: Informer, names: list[str]):
        self._jobs = jobs
        self.names = set(names)
        self.jobs: dict[str, Watched] = {}
        self._load(self.names)

    def _load(self, names: set[str]) -> None:
        from ..converge import Watched

        for name in names:
            o = self._jobs.objects.get(name)
            self.jobs[name] = (
                Watched({}, deleted=True)
                if o is None
                else Watched(cast("JobStatusDict", o.status or {}), service=o.spec.get("type") == "service")
            )

    def wait(self, timeout: float) -> None:
        self._jobs.wait(timeout)

    def poll(self) -> set[str]:
        changed = self._jobs.poll() & self.names
        self._load(changed)
        return changed

    def all_settled(self) -> bool:
        if not all(w.settled for w in self.jobs.values()):
            return False
        return not self._stale(self.names)

    def failures(self) -> list[str]:
        from ..converge import did_not_succeed

        ended = {n for n, w in self.jobs.items() if did_not_succeed(w)}
        return sorted(ended - self._stale(ended)) if ended else []

    def _stale(self, names: set[str]) -> set[str]:
        from ..api.revisions import stale_completions

        objs = sorted((self._jobs.objects[n] for n in names if n in self._jobs.objects), key=_name)
        return stale_completions(objs, self._jobs.objects.get)


def _listing(
    kind: str, found: list[StoredObject], names: list[str], requirements: list[Requirement] | None, strict: bool
) -> Listing:
    """What reads.objects answers, from the objects the server sent: the named ones (NotFound
    for a missing one, unless not `strict`), services among jobs, then the selector."""
    from ..reads import SERVICES, Listing, not_found

    service = kind.lower() in SERVICES
    label = "Service" if service else resolve_kind(kind).kind
    found = sorted((o for o in found if not names or o.name in names), key=_name)
    present = {o.name for o in found}
    missing = [n for n in names if n not in present]
    if missing and strict:
        raise NotFound("; ".join(not_found(label, n) for n in missing))
    if requirements:
        found = [o for o in found if _matches(requirements, o)]
    return Listing(label, found, missing)


def _name(obj: StoredObject) -> str:
    return obj.name


def _parsed(selector: str | None) -> list[Requirement] | None:
    return parse(selector) if selector else None


def _matches(requirements: list[Requirement], obj: StoredObject) -> bool:
    from ..selectors import matches

    return matches(requirements, obj.labels)


def _invalid(problems: list[str]) -> InvalidInput:
    from ..manifests import invalid

    return invalid(problems)
