"""The machine's real RabbitMQ (amqp://guest:guest@127.0.0.1:5672/) for the Source tests:
queues with unique names per test (deleted afterwards), a dead-letter exchange when asked,
publishing with message ids, and the broker's own view of a queue. `close_connections` has
the broker close a client's connections (rabbitmqctl), as a broker restart or an operator
would: the client sees the connection go away from the other side."""

from __future__ import annotations

import subprocess
import time
import uuid
from typing import Any

import pika

URL = "amqp://guest:guest@127.0.0.1:5672/"


class Broker:
    def __init__(self, url: str = URL):
        self.url = url
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, prefix: str = "rctest", *, dead_letters: bool = False) -> tuple[str, str | None]:
        """A new durable queue (and, with dead_letters, a fanout exchange and a queue that
        gets what the first rejects without requeue). Returns (queue, dead-letter queue)."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        arguments: dict[str, Any] = {}
        dead = None
        if dead_letters:
            exchange, dead = f"{name}-dlx", f"{name}-dead"
            self.channel.exchange_declare(exchange, exchange_type="fanout")
            self.channel.queue_declare(dead, durable=True)
            self.channel.queue_bind(dead, exchange)
            self.exchanges.append(exchange)
            self.queues.append(dead)
            arguments["x-dead-letter-exchange"] = exchange
        self.channel.queue_declare(name, durable=True, arguments=arguments)
        self.queues.append(name)
        return name, dead

    def publish(self, queue: str, body: str | bytes, message_id: str | None = None) -> None:
        properties = pika.BasicProperties(message_id=message_id, delivery_mode=2)
        self.channel.basic_publish("", queue, body, properties)

    def depth(self, queue: str) -> tuple[int, int]:
        """(ready, unacknowledged) messages, as the broker counts them."""
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "name", "messages_ready", "messages_unacknowledged"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == queue:
                return int(parts[1]), int(parts[2])
        raise AssertionError(f"queue {queue} not listed by the broker:\n{out}")

    def get(self, queue: str) -> list[tuple[Any, bytes]]:
        """Take every message of a queue (acknowledged): (properties, body)."""
        found = []
        while True:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                return found
            found.append((properties, body))

    def close(self) -> None:
        for queue in self.queues:
            self.channel.queue_delete(queue)
        for exchange in self.exchanges:
            self.channel.exchange_delete(exchange)
        self.connection.close()


def connection_pids(name: str) -> list[str]:
    """The broker's ids of the live connections whose client named itself `name`."""
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [line.split()[0] for line in out.splitlines() if f'"{name}"' in line or f'<<"{name}">>' in line]


def close_connections(name: str, reason: str = "closed by the test") -> int:
    """Have the broker close every connection of the client named `name`; how many."""
    pids = connection_pids(name)
    for pid in pids:
        subprocess.run(["rabbitmqctl", "-q", "close_connection", pid, reason], timeout=60, check=True)
    return len(pids)


def wait_connections(name: str, count: int = 1, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        pids = connection_pids(name)
        if len(pids) >= count:
            return pids
        if time.monotonic() > deadline:
            raise AssertionError(f"no connection named {name!r} at the broker within {timeout}s")
        time.sleep(0.2)
