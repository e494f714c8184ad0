"""Fixtures for the Source tests: real controller processes on a temporary store (the crash
harness's Env), the machine's real RabbitMQ with queues made per test, and a loopback TCP
relay in front of it that the tests can take away and bring back."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.crash.harness import env  # noqa: F401  (the shared fixture)
from tests.data.rabbit import Broker


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker()
    try:
        yield b
    finally:
        b.close()


class Relay:
    """A TCP relay on a fixed loopback port to RabbitMQ's: `up()` listens and forwards,
    `down()` stops listening and cuts every connection, as a broker host going away would."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5672)):
        self.target = target
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.accepted = 0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
                self.accepted += 1
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept(), which holds the port
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@pytest.fixture
def relay() -> Iterator[Relay]:
    r = Relay()
    try:
        yield r
    finally:
        r.down()
