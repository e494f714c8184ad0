"""Talking to `reconciler serve`: one HTTP connection pool with the bearer token; a `Status`
answer becomes the error it stands for (wire.error_of), and a server that cannot be reached
is an error naming its address (exit 1), never a fallback to a local store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from ..errors import InvalidInput, ReconcilerError
from ..wire import error_of

TIMEOUT = httpx.Timeout(10.0, read=300.0)  # an apply of thousands of objects takes seconds to answer
STREAM_TIMEOUT = httpx.Timeout(10.0, read=None)  # a watch or a log follow waits as long as it must


class Http:
    def __init__(self, server: str, token: str | None):
        if not server.startswith(("http://", "https://")):
            raise InvalidInput(f"--server {server!r}: use http://HOST:PORT or https://HOST:PORT")
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # SSL_CERT_FILE / SSL_CERT_DIR name the authority of a server's certificate (trust_env)
        try:
            self._client = httpx.Client(base_url=self.server, headers=headers, timeout=TIMEOUT)
        except (OSError, ValueError) as exc:  # an unreadable SSL_CERT_FILE, say
            raise ReconcilerError(f"cannot set up a connection to the server at {self.server}: {exc}") from None

    def close(self) -> None:
        self._client.close()

    def call(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        """One request; the answer's JSON."""
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"} if content is not None else None
        with self._failures():
            response = self._client.request(method, path, params=_params(params), content=content, headers=headers)
        self._check(response)
        return response.json()

    def lines(self, path: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """A streamed answer's lines (a watch), read as they come; errors are raised at once."""
        response = self._open(path, params)
        return self._read(response, text=False)

    def text(self, path: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """A streamed plain-text answer (logs), in pieces as they come; errors raised at once."""
        response = self._open(path, params)
        return self._read(response, text=True)

    def _open(self, path: str, params: dict[str, Any] | None) -> httpx.Response:
        request = self._client.build_request("GET", path, params=_params(params), timeout=STREAM_TIMEOUT)
        with self._failures():
            response = self._client.send(request, stream=True)
        if response.status_code >= 400:
            try:
                response.read()
            finally:
                response.close()
            self._check(response)
        return response

    def _read(self, response: httpx.Response, *, text: bool) -> Iterator[str]:
        try:
            with self._failures():
                yield from response.iter_text() if text else response.iter_lines()
        finally:
            response.close()

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            document = response.json()
        except ValueError:
            document = None
        raise error_of(response.status_code, document, self.server)

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """Transport failures as one line naming the server (exit 1)."""
        try:
            yield
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise ReconcilerError(f"cannot reach the server at {self.server}: {reason}") from None


def _params(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """Query parameters without the unset ones; booleans as Kubernetes spells them."""
    if params is None:
        return None
    return {k: ("true" if v is True else "false" if v is False else v) for k, v in params.items() if v is not None}
