"""A webhook receiver on loopback for notifier tests and the notify benchmark: a real HTTP
server in a thread that records every POST (path, headers, body, when it arrived) and
answers as the path says:
- `/ok`: 200;
- `/flaky`: 500 the first time an event id arrives, 200 after;
- `/hang`: holds the request until `release()` (then 200);
- `/trickle`: 200 at once, then a 100-byte body one byte a second (until `release()`);
- `/cut`: 200 announcing a 100-byte body, 10 bytes of it, then the connection closed;
- `/slow-headers`: the status line at once, then a header line every 3 s for 45 s (until
  `release()`), then the end of the headers: no read waits long, the answer takes 45 s.

With `tls` (a certificate file and its key: `tests.helpers.self_signed`), it serves HTTPS instead; the
handshake is made in the request's own thread, at its first read.
"""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when the body was read


class Receiver:
    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.requests: list[Request] = []
        self.answered = 0
        self._lock = threading.Lock()
        self._released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver would

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = Request(self.path, dict(self.headers), body, time.time())
                with receiver._lock:
                    receiver.requests.append(request)
                    seen = sum(
                        1
                        for r in receiver.requests
                        if r.headers.get("X-Reconciler-Event") == request.headers.get("X-Reconciler-Event")
                    )
                if self.path == "/hang":
                    receiver._released.wait(60)
                if self.path == "/slow-headers":
                    self._slow_headers()
                    return
                code = 500 if self.path == "/flaky" and seen == 1 else 200
                self.send_response(code)
                self.send_header("Content-Length", "100" if self.path in ("/trickle", "/cut") else "0")
                self.end_headers()
                if self.path == "/cut":
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    self.close_connection = True
                if self.path == "/trickle":
                    self.wfile.flush()
                    for _ in range(100):
                        if receiver._released.wait(1):
                            break
                        try:
                            self.wfile.write(b"x")
                            self.wfile.flush()
                        except OSError:  # the client went away: it had its answer
                            break
                    self.close_connection = True
                with receiver._lock:
                    receiver.answered += 1

            def _slow_headers(self) -> None:
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    self.wfile.flush()
                    for i in range(15):
                        if receiver._released.wait(3):
                            break
                        self.wfile.write(b"X-Wait: %d\r\n" % i)
                        self.wfile.flush()
                    self.wfile.write(b"Content-Length: 0\r\n\r\n")
                    self.wfile.flush()
                except OSError:  # the client went away
                    pass
                self.close_connection = True
                with receiver._lock:
                    receiver.answered += 1

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            # not at accept, in the server's one thread: a client slow to shake hands holds
            # only its own request's thread
            self.server.socket = context.wrap_socket(
                self.server.socket, server_side=True, do_handshake_on_connect=False
            )
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()

    def release(self) -> None:
        self._released.set()

    def at(self, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path == path]
