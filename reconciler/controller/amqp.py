"""A Source's AMQP queue (RabbitMQ), through pika's blocking connection, used by one lane
thread only (pika connections are not thread-safe).

Messages are consumed with manual acknowledgement and a prefetch window, so the broker keeps
each one until the lane settles it: acknowledged once its job is stored, rejected without
requeue (to the queue's dead-letter exchange, if it has one) when it is not a valid job. A
connection that breaks before that hands every unsettled message back to the queue; the
redelivery finds its job (intake.py) and is acknowledged then."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from ..api.source import AmqpQueue, shown_url
from .intake import Message, Verdict
from .queues import QueueError

if TYPE_CHECKING:
    import pika
    from pika.adapters.blocking_connection import BlockingChannel

# pika logs every connection step at INFO, and a broker it cannot reach in seven lines and a
# traceback at ERROR per attempt before it raises: the lane says that once, the URL masked
logging.getLogger("pika").setLevel(logging.CRITICAL)

PREFETCH = 1000  # unacknowledged messages the broker sends ahead: a batch's worth, and the next
BATCH = 500  # messages stored in one transaction at most
HEARTBEAT = 30  # seconds: a broker that stopped answering is noticed within about two of these
CONNECT_TIMEOUT = 10.0


def message_id(properties: Any, body: bytes) -> str:
    """The message's id (the AMQP message-id property); a message without one is known by its
    body's SHA-256, so identical id-less bodies make one job."""
    given = getattr(properties, "message_id", None)
    return str(given) if given else "sha256:" + hashlib.sha256(body).hexdigest()


def describe(exc: BaseException) -> str:
    """pika's exceptions as one line a person can act on."""
    import pika.exceptions as errors

    if isinstance(exc, errors.ChannelClosedByBroker | errors.ConnectionClosedByBroker):
        return f"{exc.reply_code} {exc.reply_text}"
    # pika's connection errors carry the cause as an argument whose repr says it, not its str
    said = "; ".join(a if isinstance(a, str) else repr(a) for a in exc.args)
    if isinstance(exc, errors.ProbableAuthenticationError):
        return f"login refused ({said})"
    return said or type(exc).__name__


class AmqpConsumer:
    """connect, then fetch and settle batches; any failure is a QueueError and the caller
    closes this consumer and makes a new one."""

    def __init__(self, spec: AmqpQueue, name: str):
        self.spec = spec
        self.name = name
        self.where = f"{shown_url(spec.url)} queue {spec.queue}"
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._arrived: list[Message] = []
        self._cancelled: str | None = None  # why the broker cancelled our consumer, if it did

    def connect(self) -> None:
        import pika

        try:
            parameters = pika.URLParameters(self.spec.url)
            parameters.connection_attempts = 1
            parameters.socket_timeout = CONNECT_TIMEOUT
            parameters.heartbeat = HEARTBEAT
            parameters.blocked_connection_timeout = 60
            # named, so the broker's tools show whose connection it is
            parameters.client_properties = {"connection_name": f"reconciler source/{self.name}"}
            self._connection = pika.BlockingConnection(parameters)
            channel = self._connection.channel()
            channel.queue_declare(self.spec.queue, passive=True)  # it must exist: we do not define it
            channel.basic_qos(prefetch_count=PREFETCH)
            # the broker cancels a consumer whose queue is deleted: said, not waited on for ever
            channel.add_on_cancel_callback(self._on_cancel)
            channel.basic_consume(self.spec.queue, on_message_callback=self._on_message)
            self._channel = channel
        except Exception as exc:  # pika raises its own, socket and value errors
            raise QueueError(f"{self.where}: {describe(exc)}") from exc

    def _on_message(self, _channel: Any, method: Any, properties: Any, body: bytes) -> None:
        self._arrived.append(Message(message_id(properties, body), body, method.delivery_tag))

    def _on_cancel(self, _frame: Any) -> None:
        self._cancelled = "the broker cancelled the consumer (the queue was deleted?)"

    def fetch(self, wait: float) -> list[Message]:
        """What has arrived, waiting up to `wait` seconds for the first; at most BATCH."""
        assert self._connection is not None
        try:
            if not self._arrived:
                self._connection.process_data_events(time_limit=wait)
            if self._arrived:  # whatever else the socket holds already joins this batch
                self._connection.process_data_events(time_limit=0)
        except Exception as exc:
            raise QueueError(f"{self.where}: {describe(exc)}") from exc
        if self._cancelled is not None:  # nothing more comes: the lane connects anew (what
            # arrived before is not settled and goes back to the queue, if it is there again)
            raise QueueError(f"{self.where}: {self._cancelled}")
        batch, self._arrived = self._arrived[:BATCH], self._arrived[BATCH:]
        return batch

    def settle(self, verdicts: list[Verdict]) -> None:
        """Acknowledge what was stored, reject (no requeue) what was refused. One
        acknowledgement covers a batch without rejections (tags before it were all settled)."""
        channel = self._channel
        assert channel is not None
        try:
            if all(v.outcome != "rejected" for v in verdicts):
                channel.basic_ack(verdicts[-1].message.tag, multiple=True)
                return
            for v in verdicts:
                if v.outcome == "rejected":
                    channel.basic_reject(v.message.tag, requeue=False)
                else:
                    channel.basic_ack(v.message.tag)
        except Exception as exc:
            raise QueueError(f"{self.where}: {describe(exc)}") from exc

    def close(self) -> None:
        """Unsettled messages go back to the queue with the connection."""
        connection, self._connection, self._channel, self._arrived = self._connection, None, None, []
        if connection is not None and connection.is_open:
            with contextlib.suppress(Exception):  # already broken: nothing more to hand back
                connection.close()
