"""A small queue server speaking the seed's HTTP protocol, on loopback, for the Source tests:
`GET /queues/{queue}/messages` answers every message not yet deleted (so one not deleted is
delivered again on the next GET, as SQS does after its visibility timeout), and
`DELETE /queues/{queue}/messages/{id}` removes one. `down` answers 503 to everything."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QueueServer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[str, dict[str, Any]] = {}  # queue -> id -> body (insertion ordered)
        self.deleted: list[tuple[str, str]] = []
        self.gets = 0
        self.down = False
        self.raw: list[Any] = []  # entries answered as they are (malformed ones), after the messages
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _parts(self) -> list[str]:
                return self.path.strip("/").split("/")

            def _answer(self, code: int, document: Any = None) -> None:
                body = b"" if document is None else json.dumps(document).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                parts = self._parts()
                if server.down:
                    return self._answer(503, {"error": "down"})
                if len(parts) != 3 or parts[0] != "queues" or parts[2] != "messages":
                    return self._answer(404)
                with server.lock:
                    server.gets += 1
                    items = [{"id": i, "body": b} for i, b in server.queues.get(parts[1], {}).items()]
                    items += server.raw
                return self._answer(200, items)

            def do_DELETE(self) -> None:
                parts = self._parts()
                if server.down:
                    return self._answer(503, {"error": "down"})
                if len(parts) != 4 or parts[0] != "queues" or parts[2] != "messages":
                    return self._answer(404)
                with server.lock:
                    gone = server.queues.get(parts[1], {}).pop(parts[3], None)
                    kept = [e for e in server.raw if not (isinstance(e, dict) and str(e.get("id")) == parts[3])]
                    gone, server.raw = gone if len(kept) == len(server.raw) else "raw", kept
                    server.deleted.append((parts[1], parts[3]))
                return self._answer(204 if gone is not None else 404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def put(self, queue: str, message_id: str, body: Any) -> None:
        with self.lock:
            self.queues.setdefault(queue, {})[message_id] = body

    def waiting(self, queue: str) -> list[str]:
        with self.lock:
            return list(self.queues.get(queue, {}))

    def __enter__(self) -> QueueServer:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
