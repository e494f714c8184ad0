"""The door every request passes before any route: the bearer token and its role (auth.py),
then the request body's size. Refusals are Kubernetes `Status` objects.

Without tokens the API answers only loopback (serve binds nothing else), but a web page the
user opens can still reach it through the browser: a token-less door also refuses what
localonly.py says such a page's requests look like."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..localonly import web_page_request
from ..wire import status
from . import dashboard
from .auth import Tokens, refusal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY = 8 * 2**20  # as one manifest file (manifests.MAX_FILE_BYTES): an apply of thousands of jobs fits
OPEN_PATHS = ("/healthz", "/leader")  # what a load balancer or systemd probes without a token


class Guard:
    def __init__(self, app: ASGIApp, *, tokens: Tokens | None, max_body: int = MAX_BODY):
        """`tokens` None: no authentication (serve then listens on loopback only)."""
        self.app = app
        self.tokens = tokens
        self.max_body = max_body

    @property
    def on_exit(self) -> list[Callable[[], None]]:
        """What to tell when the server is asked to stop: the app's (its long polls, streams)."""
        return list(getattr(getattr(self.app, "state", None), "on_exit", []))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.tokens is None and (why := _not_local(scope)) is not None:
            await _refuse(send, 403, why)
            return
        if self.tokens is not None and scope["path"] not in OPEN_PATHS and not dashboard.is_open(scope["path"]):
            identity = self.tokens.identify(_bearer(scope))
            if identity is None:
                await _refuse(send, 401, "no valid bearer token (send Authorization: Bearer TOKEN)")
                return
            if (why := refusal(identity, scope["method"], scope["path"])) is not None:
                await _refuse(send, 403, why)
                return
            scope["reconciler.role"] = identity.role  # what the dashboard offers (buttons for admins)
        body = await self._body(scope, receive, send)
        if body is None:
            return
        await self.app(scope, _replay(body, receive), send)

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole request body, read before the route sees it, or None when it was too large
        (answered 413): a route never holds more than `max_body` bytes of one request."""
        too_large = f"request body larger than {self.max_body} bytes"
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            await _refuse(send, 413, too_large)
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return b""
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _refuse(send, 413, too_large)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _not_local(scope: Scope) -> str | None:
    """Why a request to the token-less API may come from a web page, or None."""
    return web_page_request(_header(scope, b"host"), _header(scope, b"origin"), _header(scope, b"sec-fetch-site"))


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body once, then the connection's own messages (a disconnect, for a stream)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip()
    return None


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


async def _refuse(send: Send, code: int, message: str) -> None:
    body = json.dumps(status(code, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if code == 401:
        headers.append((b"www-authenticate", b'Bearer realm="reconciler"'))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
