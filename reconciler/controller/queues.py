"""What a Source's lane needs of a queue, whatever its protocol: connect, fetch a batch of
messages, settle them (acknowledge or reject) once their jobs are stored, close."""

from __future__ import annotations

import threading
from typing import Protocol

from ..api.source import SourceSpec
from .intake import Message, Verdict


class QueueError(Exception):
    """The queue cannot be reached or refused us; the message is what the Source's status shows."""


class Consumer(Protocol):
    where: str  # the queue, as errors name it (no password)

    def connect(self) -> None: ...
    def fetch(self, wait: float) -> list[Message]: ...
    def settle(self, verdicts: list[Verdict]) -> None: ...
    def close(self) -> None: ...


def consumer(spec: SourceSpec, name: str, stop: threading.Event) -> Consumer:
    """The consumer of the Source's queue (the protocol's module imported only when used)."""
    if spec.amqp is not None:
        from .amqp import AmqpConsumer

        return AmqpConsumer(spec.amqp, name)
    from .httpqueue import HttpConsumer

    assert spec.http is not None
    return HttpConsumer(spec.http, stop)
