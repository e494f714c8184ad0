"""The server's agent routes, for one node, over the standard library's HTTP client: a
keep-alive connection per calling thread (heartbeat, long poll, reports). httpx cost about
3.5 ms of CPU a request here, most of it building URLs. Reports go several at once
(`reports`): the runs that start or end together cost one request."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from ..agentwire import AGENT_HEADER, QUIET_ENDS_HEADER

CONNECT_TIMEOUT = 10.0


class Stale(Exception):
    """The server refused a report: the admission it names is no longer current (409)."""


class Unreachable(Exception):
    """No answer, or one that is not a success: try again later."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # the HTTP status of an answer that is not a success


class Unauthorized(Unreachable):
    """The server refused the token (401: unknown or missing; 403: not this node's)."""


class Api:
    def __init__(self, server: str, node: str, token: str | None, verify: bool | str = True, agent: str | None = None):
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"--server {server}: give http(s)://HOST[:PORT]")
        self.https = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.https else 80)
        self.base = url.path.rstrip("/") + f"/apis/reconciler.dev/v1alpha1/nodes/{quote(node)}"
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", QUIET_ENDS_HEADER: "1"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        if agent:  # the server refuses runs and reports from an agent that does not serve the node
            self.headers[AGENT_HEADER] = agent
        self.context: ssl.SSLContext | None = None
        if self.https:
            self.context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
            if verify is False:
                self.context.check_hostname, self.context.verify_mode = False, ssl.CERT_NONE
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=CONNECT_TIMEOUT, context=self.context)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def call(self, method: str, path: str, body: Any = None, *, timeout: float = CONNECT_TIMEOUT) -> Any:
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(2):  # a kept connection the server closed meanwhile: once more on a new one
            conn = self._connection()
            try:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, self.base + path, body=data, headers=self.headers)
                answer = conn.getresponse()
                text = answer.read()
                status = answer.status
                if answer.will_close:
                    self._drop()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self._drop()
                if attempt == 1:
                    raise Unreachable(str(exc) or type(exc).__name__) from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise Unreachable(str(exc) or type(exc).__name__) from None
        try:
            document = json.loads(text) if text else {}
        except ValueError:
            document = {"message": text.decode("utf-8", "replace")[:200]}
        if status == 409:
            raise Stale(document.get("message", "conflict"))
        if status in (401, 403):
            raise Unauthorized(f"HTTP {status}: {document.get('message', '')}", status)
        if status >= 400:
            raise Unreachable(f"HTTP {status}: {document.get('message', '')}", status)
        return document

    def heartbeat(self, body: dict[str, Any]) -> Any:
        return self.call("POST", "/heartbeat", body)

    def runs(self, known: str, wait: float) -> Any:
        query = urlencode({"known": known, "timeoutSeconds": wait})
        return self.call("GET", f"/runs?{query}", timeout=wait + 15)

    def report(self, job: str, body: dict[str, Any]) -> None:
        self.call("POST", f"/runs/{quote(job)}/report", body)

    def reports(self, items: list[dict[str, Any]]) -> list[str | None]:
        """Several runs' reports in one request (each item a report with its `job`): per item,
        None when it was kept, else why it was refused (stale, as a single report's 409)."""
        answer = self.call("POST", "/runs/reports", {"items": items})
        judged = answer.get("items", [])
        if len(judged) != len(items):
            raise Unreachable(f"the server answered {len(judged)} of {len(items)} reports")
        return [None if item.get("code") == 200 else str(item.get("message") or "stale") for item in judged]

    def kept(self, runs: list[tuple[str, int, str]]) -> list[bool]:
        """Which of these ended runs (job uid, run number, node uid) the store still keeps, in order."""
        items = [{"uid": uid, "run": run, "nodeUid": node_uid} for uid, run, node_uid in runs]
        answer = self.call("POST", "/runs/kept", {"items": items})
        judged = answer.get("items", [])
        if len(judged) != len(runs):
            raise Unreachable(f"the server answered {len(judged)} of {len(runs)} runs")
        return [bool(item.get("kept")) for item in judged]

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
