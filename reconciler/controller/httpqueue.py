"""A Source's queue over the seed's HTTP protocol: `GET {url}/queues/{queue}/messages` answers
the messages ready now, as a JSON list (or `{"messages": [...]}`) of `{"id", "body"}` (a body
is a string, or a JSON value taken as its JSON text); `DELETE {url}/queues/{queue}/messages/{id}`
removes one, which the lane does only once its job is stored (or it was refused). A message not
deleted is the queue server's to deliver again; its id finds the job made of it then.

A malformed entry of an answer is one refused message, not a failed GET: with an id but no
body it is rejected (a MessageRejected event) and deleted like any invalid message; without
an id there is nothing to delete it by, so it is said once (an event and a log line) and
skipped while the queue keeps answering it. The answer's other messages are ingested."""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..api.source import HttpQueue, shown_url
from .intake import Message, Verdict
from .queues import QueueError

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("reconciler.ingest")

TIMEOUT = 10.0
MAX_MESSAGES = 1000  # of one answer: more waits for the next GET
NO_ID = "(no id)"  # the message id an entry without one is said by
SKIPPED_KEPT = 1000  # entries without an id remembered as said (a queue full of them says some again)


class HttpConsumer:
    def __init__(self, spec: HttpQueue, stop: threading.Event):
        self.spec = spec
        self.stop = stop
        self.base = f"{spec.url}/queues/{quote(spec.queue, safe='')}/messages"
        self.where = f"{shown_url(spec.url)} queue {spec.queue}"
        self._client: httpx.Client | None = None
        self._idle = False  # the last GET found nothing: the next waits first
        self._skipped: set[int] = set()  # entries without an id already said: answered again each GET

    def connect(self) -> None:
        import httpx

        self._client = httpx.Client(timeout=TIMEOUT, headers={"User-Agent": "reconciler"})

    def fetch(self, wait: float) -> list[Message]:
        import httpx

        assert self._client is not None
        if self._idle and self.stop.wait(wait):
            return []  # the protocol has no long poll: an empty queue is asked again after `wait`
        try:
            response = self._client.get(self.base)
        except httpx.HTTPError as exc:
            raise QueueError(f"GET {shown_url(self.base)}: {shown_url(str(exc)) or type(exc).__name__}") from None
        if not response.is_success:
            raise QueueError(f"GET {shown_url(self.base)}: HTTP {response.status_code} {response.reason_phrase}")
        try:
            found = self._messages(response.json())
        except ValueError as exc:
            raise QueueError(f"GET {shown_url(self.base)}: not a list of messages: {exc}") from None
        self._idle = not found
        return found

    def _messages(self, document: Any) -> list[Message]:
        items = document.get("messages") if isinstance(document, dict) else document
        if not isinstance(items, list):
            raise ValueError("expected a JSON list, or an object with messages")
        found: list[Message] = []
        for item in items:  # entries without an id said before count for nothing: no stall behind them
            if len(found) >= MAX_MESSAGES:
                break
            key = item.get("id") if isinstance(item, dict) else None
            if not isinstance(key, str | int | float) or isinstance(key, bool) or key == "":
                # nothing to DELETE it by: the queue answers it again on every GET, so it is said once
                whole = json.dumps(item)
                if hash(whole) in self._skipped:
                    continue
                if len(self._skipped) >= SKIPPED_KEPT:
                    self._skipped.clear()
                self._skipped.add(hash(whole))
                text = shown_url(whole)[:100]  # events are shown to every reader
                log.warning("%s: an entry without an id skipped: %s", self.where, text)
                problem = f"id: missing, so it cannot be deleted; skipped (the queue keeps it): {text}"
                found.append(Message(NO_ID, b"", None, problem=problem))
            elif "body" not in item:
                found.append(Message(str(key), b"", key, problem="body: missing"))
            else:
                body = item["body"]
                text = body if isinstance(body, str) else json.dumps(body)
                found.append(Message(str(key), text.encode(), key))
        return found

    def settle(self, verdicts: list[Verdict]) -> None:
        """DELETE each message, stored or refused; one already gone (404) is fine."""
        import httpx

        assert self._client is not None
        for v in verdicts:
            if v.message.tag is None:
                continue  # an entry without an id: nothing to delete it by
            url = f"{self.base}/{quote(str(v.message.tag), safe='')}"
            try:
                response = self._client.delete(url)
            except httpx.HTTPError as exc:
                raise QueueError(f"DELETE {shown_url(url)}: {shown_url(str(exc)) or type(exc).__name__}") from None
            if not response.is_success and response.status_code != 404:
                raise QueueError(f"DELETE {shown_url(url)}: HTTP {response.status_code} {response.reason_phrase}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
