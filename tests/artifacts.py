"""What the artifact tests share: zips built member by member (hostile ones included), and a
real HTTP server on loopback, in a thread of the test, that counts what it is asked and can
stall, refuse or revalidate."""

from __future__ import annotations

import hashlib
import http.server
import io
import stat
import struct
import threading
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Member:
    name: str
    data: bytes | str = b""
    mode: int = stat.S_IFREG | 0o644  # the Unix mode in the high bits of external_attr
    method: int = zipfile.ZIP_DEFLATED
    flags: int = 0

    @classmethod
    def link(cls, name: str, target: str) -> Member:
        return cls(name, target, stat.S_IFLNK | 0o777, zipfile.ZIP_STORED)

    @classmethod
    def folder(cls, name: str) -> Member:
        return cls(name.rstrip("/") + "/", b"", stat.S_IFDIR | 0o755, zipfile.ZIP_STORED)

    @classmethod
    def script(cls, name: str, text: str) -> Member:
        return cls(name, text, stat.S_IFREG | 0o755)


def zip_bytes(*members: Member) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w") as zf:
        warnings.simplefilter("ignore")  # "Duplicate name": some tests want one
        for m in members:
            info = zipfile.ZipInfo(m.name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = m.mode << 16
            info.create_system = 3  # Unix
            info.compress_type = m.method
            zf.writestr(info, m.data)
    data = bytearray(buffer.getvalue())
    if any(m.flags for m in members):  # zipfile writes its own flags: set ours in both headers
        infos = zipfile.ZipFile(io.BytesIO(bytes(data))).infolist()
        central = data.find(b"PK\x01\x02")
        for m, info in zip(members, infos, strict=True):
            data[info.header_offset + 6] |= m.flags
            data[central + 8] |= m.flags
            name_len, extra_len, comment_len = struct.unpack_from("<3H", data, central + 28)
            central += 46 + name_len + extra_len + comment_len
    return bytes(data)


def write_zip(path: Path, *members: Member) -> str:
    """Write the zip; return its sha256."""
    data = zip_bytes(*members)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def bomb(size: int = 256 * 2**20) -> bytes:
    """One member of `size` zero bytes, deflated (about 1000:1): 256 MiB in 255 KiB."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("zeros", "w", force_zip64=True) as out:
        block = bytes(2**20)
        for _ in range(size // len(block)):
            out.write(block)
    return buffer.getvalue()


@dataclass
class Served:
    data: bytes
    etag: str | None = None
    status: int = 200
    length: bool = True  # send Content-Length (else the body ends with the connection)
    encoding: str | None = None  # a Content-Encoding header to claim


@dataclass
class Server:
    """http.server in a thread on 127.0.0.1: `files` by path, `gets` counts each path's GET
    requests, `conditional` those that carried If-None-Match. While `stall` is set, each answer
    sends half its body and waits until `stall` is cleared (or the server stops)."""

    files: dict[str, Served] = field(default_factory=dict)
    gets: Counter[str] = field(default_factory=Counter)
    conditional: Counter[str] = field(default_factory=Counter)
    stall: threading.Event = field(default_factory=threading.Event)
    stalled: threading.Event = field(default_factory=threading.Event)  # an answer is waiting
    go: threading.Event = field(default_factory=threading.Event)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def put(self, path: str, data: bytes, **kw) -> str:
        self.files[path] = Served(data, **kw)
        return self.url(path)

    def release(self) -> None:
        self.go.set()


def serve() -> tuple[Server, http.server.ThreadingHTTPServer]:
    state = Server()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            state.gets[self.path] += 1
            served = state.files.get(self.path)
            if served is None:
                self.send_error(404)
                return
            if served.etag and self.headers.get("If-None-Match") == served.etag:
                state.conditional[self.path] += 1
                self.send_response(304)
                self.send_header("ETag", served.etag)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(served.status)
            if served.etag:
                self.send_header("ETag", served.etag)
            if served.encoding:
                self.send_header("Content-Encoding", served.encoding)
            if served.length:
                self.send_header("Content-Length", str(len(served.data)))
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if state.stall.is_set():
                half = len(served.data) // 2
                self.wfile.write(served.data[:half])
                self.wfile.flush()
                state.stalled.set()
                state.go.wait(120)
                self.wfile.write(served.data[half:])
            else:
                self.wfile.write(served.data)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, args=(0.05,), name="test-http", daemon=True).start()
    return state, httpd


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
