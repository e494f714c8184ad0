"""A Source's queue over the seed's HTTP protocol: `GET {url}/queues/{queue}/messages` answers
the messages ready now, as a JSON list (or `{"messages": [...]}`) of `{"id", "body"}` (a body
is a string, or a JSON value taken as its JSON text); `DELETE {url}/queues/{queue}/messages/{id}`
removes one, which the lane does only once its job is stored (or it was refused). A message not
deleted is the queue server's to deliver again; its id finds the job made of it then."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..api.source import HttpQueue, shown_url
from .intake import Message, Verdict
from .queues import QueueError

if TYPE_CHECKING:
    import httpx

TIMEOUT = 10.0
MAX_MESSAGES = 1000  # of one answer: more waits for the next GET


class HttpConsumer:
    def __init__(self, spec: HttpQueue, stop: threading.Event):
        self.spec = spec
        self.stop = stop
        self.base = f"{spec.url}/queues/{quote(spec.queue, safe='')}/messages"
        self.where = f"{shown_url(spec.url)} queue {spec.queue}"
        self._client: httpx.Client | None = None
        self._idle = False  # the last GET found nothing: the next waits first

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
            found = _messages(response.json())
        except ValueError as exc:
            raise QueueError(f"GET {shown_url(self.base)}: not a list of messages: {exc}") from None
        self._idle = not found
        return found[:MAX_MESSAGES]

    def settle(self, verdicts: list[Verdict]) -> None:
        """DELETE each message, stored or refused; one already gone (404) is fine."""
        import httpx

        assert self._client is not None
        for v in verdicts:
            url = f"{self.base}/{quote(str(v.message.tag), safe='')}"
            try:
                response = self._client.delete(url)
            except httpx.HTTPError as exc:
                raise QueueError(f"DELETE {shown_url(url)}: {exc or type(exc).__name__}") from None
            if not response.is_success and response.status_code != 404:
                raise QueueError(f"DELETE {shown_url(url)}: HTTP {response.status_code} {response.reason_phrase}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _messages(document: Any) -> list[Message]:
    items = document.get("messages") if isinstance(document, dict) else document
    if not isinstance(items, list):
        raise ValueError("expected a JSON list, or an object with messages")
    found = []
    for item in items:
        if not isinstance(item, dict) or item.get("id") is None or "body" not in item:
            raise ValueError(f"a message without id or body: {str(item)[:100]}")
        body = item["body"]
        text = body if isinstance(body, str) else json.dumps(body)
        found.append(Message(str(item["id"]), text.encode(), item["id"]))
    return found
