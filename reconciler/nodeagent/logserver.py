"""The agent's log port: `GET /logs/<run folder>?stream=&tailLines=&follow=` answers a run's
captured output as plain text, for the server's log endpoint to pass on. Token-checked (the
agent's own token, compared in constant time) when the agent has one."""

from __future__ import annotations

import hmac
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ..agent.logs import follow, read_logs
from ..localonly import web_page_request

RUN_FOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # <job>.<uid>.<number>: no path can escape runs/


class LogServer:
    def __init__(self, host: str, port: int, runs: Path, token: str | None, finished: Callable[[str], bool]):
        """`finished(folder)`: the run can write no more (a follow ends once all is read)."""
        self.runs = runs
        self.token = token
        self.finished = finished
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="log-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> LogServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # requests carry tokens in headers only; nothing of them is logged anyway

            def do_GET(self) -> None:
                server.answer(self)

        return Handler

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        if self.token is None:  # loopback only (cli/nodeagent.py); no web page may read through it
            headers = handler.headers
            why = web_page_request(headers.get("Host"), headers.get("Origin"), headers.get("Sec-Fetch-Site"))
            if why is not None:
                _plain(handler, 403, why)
                return
        else:
            given = handler.headers.get("Authorization", "")
            expected = f"Bearer {self.token}"
            if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode()):
                _plain(handler, 401, "no valid bearer token")
                return
        url = urlsplit(handler.path)
        parts = url.path.split("/")
        if len(parts) != 3 or parts[1] != "logs" or not RUN_FOLDER.match(parts[2]):
            _plain(handler, 404, "not found: GET /logs/<run folder>")
            return
        folder = parts[2]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        stream = query.get("stream")
        if stream not in (None, "stdout", "stderr"):
            _plain(handler, 400, "stream must be stdout or stderr")
            return
        tail_text = query.get("tailLines")
        tail = int(tail_text) if tail_text and tail_text.isdigit() else None
        paths = [self.runs / folder / s for s in ([stream] if stream else ["stdout", "stderr"])]
        if not any(p.exists() for p in paths):
            _plain(handler, 404, f"run {folder} has no logs on this node")
            return
        if query.get("follow") == "true":
            pieces = follow(paths, done=lambda: self.stopping.is_set() or self.finished(folder), tail=tail)
        else:
            pieces = read_logs(paths, tail=tail)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Connection", "close")
        handler.end_headers()
        try:
            for piece in pieces:
                handler.wfile.write(piece.encode("utf-8", "surrogateescape"))
                handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the reader went away


def _plain(handler: BaseHTTPRequestHandler, code: int, message: str) -> None:
    body = (message + "\n").encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "text/plain; charset=utf-8")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
