"""Following a server's objects of one kind: list once, then one watch stream read in a
thread (a Kubernetes informer, small). A stream that ends is watched again from its last
bookmark; one the server refuses as too old (410) is replaced by a new list."""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import ReconcilerError
from ..store import StoredObject
from ..wire import PREFIX, object_from
from .http import Http

log = logging.getLogger("reconciler.client")

RETRY = (0.1, 0.2, 0.5, 1.0, 2.0)  # waits between attempts to watch again, seconds


class Relist(Exception):
    """The server cannot go on from our resourceVersion: list again."""


def list_objects(http: Http, plural: str, selector: str | None = None) -> tuple[int, list[StoredObject]]:
    """A kind's objects and the resourceVersion to watch them from."""
    document = http.call("GET", f"{PREFIX}/{plural}", params={"labelSelector": selector})
    return int(document["metadata"]["resourceVersion"]), [object_from(d) for d in document["items"]]


def changes(http: Http, plural: str, since: int, selector: str | None = None) -> Iterator[tuple[str, Any]]:
    """(type, object) of one watch stream from `since`: OPEN first (with `since`) once the
    server has answered, then ADDED, MODIFIED and DELETED with the object (a StoredObject),
    BOOKMARK with its resourceVersion (an int). Relist on an ERROR (410, 504)."""
    params = {"watch": True, "resourceVersion": str(since), "allowWatchBookmarks": True, "labelSelector": selector}
    lines = http.lines(f"{PREFIX}/{plural}", params)
    yield "OPEN", since  # the server answered: whatever failed before is over
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        kind, document = event["type"], event["object"]
        if kind == "ERROR":
            raise Relist(document.get("message", "the watch ended"))
        if kind == "BOOKMARK":
            yield kind, int(document["metadata"]["resourceVersion"])
        else:
            yield kind, object_from(document)


class Informer:
    """Every object of a kind as the server last said (`objects`, by name), kept current by
    `poll()`, which applies what the watch thread received since the last poll."""

    def __init__(self, http: Http, plural: str):
        self.http = http
        self.plural = plural
        seq, found = list_objects(http, plural)
        self.objects: dict[str, StoredObject] = {o.name: o for o in found}
        self._since = seq
        self._received: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._arrived = threading.Event()  # set by each put: `wait` returns for the next poll
        self._stop = threading.Event()
        self.failure: ReconcilerError | None = None  # why the server cannot be followed now, if it cannot
        self._thread = threading.Thread(target=self._follow, name=f"watch-{plural}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def wait(self, timeout: float) -> None:
        """Until something arrived since the last poll, or `timeout` passes."""
        if self._received.empty():
            self._arrived.wait(timeout)
        self._arrived.clear()  # what arrives from now on sets it again; the poll takes what came

    def poll(self) -> set[str]:
        """Names of the objects that changed (or went away) since the last poll."""
        changed: set[str] = set()
        while True:
            try:
                kind, obj = self._received.get_nowait()
            except queue.Empty:
                return changed
            if kind == "LIST":
                before = self.objects
                self.objects = {o.name: o for o in obj}
                changed |= {
                    n for n in before.keys() | self.objects.keys() if _differs(before.get(n), self.objects.get(n))
                }
            elif kind == "DELETED":
                if self.objects.pop(obj.name, None) is not None:
                    changed.add(obj.name)
            else:
                known = self.objects.get(obj.name)
                if known is None or known.uid != obj.uid or obj.resource_version > known.resource_version:
                    self.objects[obj.name] = obj
                    changed.add(obj.name)

    def _put(self, item: tuple[str, Any]) -> None:
        self._received.put(item)
        self._arrived.set()

    def _follow(self) -> None:
        attempt, warned = 0, False
        while not self._stop.is_set():
            try:
                for kind, obj in changes(self.http, self.plural, self._since):
                    attempt, self.failure = 0, None
                    if self._stop.is_set():
                        return
                    if kind == "OPEN":
                        continue
                    if kind == "BOOKMARK":
                        self._since = obj
                    else:
                        self._put((kind, obj))
            except Relist:
                try:
                    self._since, found = list_objects(self.http, self.plural)
                except ReconcilerError:
                    continue
                self.failure = None
                self._put(("LIST", found))
            except ReconcilerError as exc:
                if self._stop.is_set():  # closed: the connection went with it
                    return
                self.failure = exc
                if not warned:
                    print(f"warning: {exc}; trying again", file=sys.stderr, flush=True)
                    warned = True
                self._stop.wait(RETRY[min(attempt, len(RETRY) - 1)])
                attempt += 1


def _differs(a: StoredObject | None, b: StoredObject | None) -> bool:
    if a is None or b is None:
        return a is not b
    return a.uid != b.uid or a.resource_version != b.resource_version
