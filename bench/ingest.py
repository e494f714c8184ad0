"""Figure 15: ingestion from RabbitMQ (the machine's broker, amqp://guest:guest@127.0.0.1:5672/)
into stored jobs, against a plain pika consumer that only acknowledges, in the same run.

- reconciler: M messages (the seed's job request, each with its own message id) are published
  to a fresh queue, then a `reconciler controller` process over a fresh SQLite store consumes
  them through a Source (its template suspends the jobs, so no run competes for the CPU; the
  change watcher still reads each new job's change, and the loop, told by the lane that a job
  stored suspended is at rest, does not look at it: controller/settled.py). Rate = messages stored as jobs, by the times
  their batches' transactions began: a batch's messages took from its start to the next
  one's, so the rate is the messages of the batches from the second to the one before the
  last over the time from the second's start to the last's. The first batch is left out,
  time and messages: it holds the few messages that arrived before the lane asked (often
  under ten) and pays the lane's first-time costs (30 ms), which counted against the 500 of
  each later batch skewed a short run. The queue is then checked empty (every message
  acknowledged).
- reference: the same M messages to another fresh queue, consumed by a plain pika consumer
  (basic_consume, the same prefetch, basic_ack per message, nothing else); rate from the first
  delivery to the last acknowledgement.

Three rounds, each reference beside its reconciler run; the medians, and the figure is the
median of the rounds' ratios (this machine's speed moves within a minute). The aim: at least
half the plain consumer's rate. Beside the rates, each side's CPU time a message over the same
span (the controller's whole process, from the first batch stored to the last): on a machine
other work loads, the wall-clock rates move with the load, the CPU a message much less.

    .venv/bin/python bench/ingest.py [--messages 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, log, median, print_table, scratch

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
AIM = 2.0  # plain consumer's rate / reconciler's: at most 2 (at least half the rate)


def _channel():
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(BROKER))
    return connection, connection.channel()


def _fill(count: int) -> str:
    """A fresh queue holding `count` job requests; its name."""
    import pika

    queue = f"bench-ingest-{uuid.uuid4().hex[:10]}"
    connection, channel = _channel()
    try:
        channel.queue_declare(queue, durable=True)
        for i in range(count):
            body = json.dumps({"command": f"echo {i}", "env_vars": {"N": str(i)}})
            channel.basic_publish("", queue, body, pika.BasicProperties(message_id=f"m{i}", delivery_mode=2))
    finally:
        connection.close()
    return queue


def _drop(queue: str) -> None:
    connection, channel = _channel()
    try:
        channel.queue_delete(queue)
    finally:
        connection.close()


def plain(count: int) -> float:
    """Messages/s of a pika consumer that only acknowledges each message."""
    from reconciler.controller.amqp import PREFETCH

    queue = _fill(count)
    connection, channel = _channel()
    stamps: list[float] = []

    cpu: list[float] = []

    def on_message(ch, method, _properties, _body) -> None:
        ch.basic_ack(method.delivery_tag)
        stamps.append(time.perf_counter())
        if len(stamps) in (1, count):
            cpu.append(time.process_time())
        if len(stamps) == count:
            ch.stop_consuming()

    try:
        channel.basic_qos(prefetch_count=PREFETCH)
        channel.basic_consume(queue, on_message_callback=on_message)
        channel.start_consuming()
    finally:
        connection.close()
        _drop(queue)
    return Rate((count - 1) / (stamps[-1] - stamps[0]), (cpu[-1] - cpu[0]) / (count - 1))


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reconciler(count: int) -> Rate:
    """Messages/s from a queue into stored jobs, by a controller process."""
    from reconciler.store import Store
    from reconciler.store.dbapi import Statement

    queue = _fill(count)
    source = (
        "apiVersion: reconciler.dev/v1alpha1\nkind: Source\nmetadata: {name: inbox}\n"
        f"spec:\n  amqp: {{url: '{BROKER}', queue: {queue}}}\n  template: {{suspend: true}}\n"
    )
    try:
        with scratch("sqlite") as (url, folder):
            env = {**os.environ, "RECONCILER_STORE": url, "XDG_STATE_HOME": str(folder)}
            (folder / "source.yaml").write_text(source)
            subprocess.run(
                [sys.executable, "-m", "reconciler", "apply", "-f", str(folder / "source.yaml")],
                env=env,
                check=True,
                capture_output=True,
            )
            store = Store(url)
            controller = subprocess.Popen(
                [sys.executable, "-m", "reconciler", "controller"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            counted = Statement("SELECT count(*) FROM ingested")
            batches = Statement(
                "SELECT created_at, count(*) AS n FROM ingested GROUP BY created_at ORDER BY created_at"
            )
            try:
                deadline = time.monotonic() + max(60.0, count / 50)
                first: tuple[int, float] | None = None  # (stored, controller CPU seconds) once one batch is
                while True:
                    with store.read() as session:
                        stored = counted.execute(session).scalar()
                    if first is None and stored:
                        first = (stored, _cpu_seconds(controller.pid))
                    if stored >= count:
                        cpu = _cpu_seconds(controller.pid)
                        with store.read() as session:
                            stamps = batches.execute(session).all()
                        break
                    if time.monotonic() > deadline or controller.poll() is not None:
                        raise TimeoutError(f"ingest: {stored} of {count} jobs stored")
                    time.sleep(0.05)
            finally:
                controller.terminate()
                controller.wait(30)
                store.dispose()
            connection, channel = _channel()
            try:  # the controller is gone: what it had not acknowledged would be back in the queue
                left = channel.queue_declare(queue, passive=True).method.message_count
            finally:
                connection.close()
            if left:
                raise AssertionError(f"ingest: {left} messages not acknowledged")
            if stored != count or len(stamps) < 3:
                raise AssertionError(f"ingest: {stored} jobs for {count} messages, in {len(stamps)} batches")
            # each batch's rows carry the time its transaction began: a batch took from its
            # start to the next one's; whole batches, the first left out
            timed = stamps[1:]
            assert first is not None
            per_message = (cpu - first[1]) / (count - first[0]) if count > first[0] else float("nan")
            rate = sum(s.n for s in timed[:-1]) / (timed[-1].created_at - timed[0].created_at)
            return Rate(rate, per_message)
    finally:
        _drop(queue)


@dataclass(frozen=True)
class Rate:
    """Messages/s, and the consumer's CPU seconds a message (its whole process: every thread),
    which a machine loaded by others changes less than it changes the wall-clock rate."""

    per_second: float
    cpu: float


def row(count: int, rounds: int = 3) -> Row:
    ours, theirs = [], []
    ours_cpu, theirs_cpu = [], []
    for i in range(rounds):  # interleaved: this machine's speed drifts within a minute
        log(f"ingest: round {i + 1} of {rounds}: {count} messages by a plain pika consumer, then by a Source")
        reference, measured = plain(count), reconciler(count)
        theirs.append(reference.per_second)
        ours.append(measured.per_second)
        theirs_cpu.append(reference.cpu)
        ours_cpu.append(measured.cpu)
    from reconciler.controller.amqp import BATCH

    rate, plain_rate = median(ours), median(theirs)
    # each round's two runs are minutes apart at most: their ratio is what this machine can tell
    ratio = median([p / o for p, o in zip(theirs, ours, strict=True)])
    label = "15 ingestion from RabbitMQ (sqlite)"
    note = (
        f"{label}: {count} job requests waiting in a queue; a controller process stores them as jobs "
        f"(batches of up to {BATCH} a transaction, then one acknowledgement a batch), median of {rounds} rounds "
        f"interleaved with the reference ({', '.join(f'{r:.0f}' for r in ours)}): {rate:.0f} messages/s against "
        f"a plain pika consumer's {plain_rate:.0f}/s acknowledging each ({', '.join(f'{r:.0f}' for r in theirs)}); "
        f"per round, ours/plain {', '.join(f'{o / p:.0%}' for o, p in zip(ours, theirs, strict=True))}: "
        f"median {1 / ratio:.0%} of its rate (aim: at least half); CPU a message, the controller process "
        f"{median(ours_cpu) * 1e6:.0f} us ({', '.join(f'{c * 1e6:.0f}' for c in ours_cpu)}) against the plain "
        f"consumer's {median(theirs_cpu) * 1e6:.0f} us ({', '.join(f'{c * 1e6:.0f}' for c in theirs_cpu)})"
    )
    return Row(
        label,
        f"{rate:.0f} messages/s into stored jobs",
        f"plain pika consumer {plain_rate:.0f}/s",
        ratio,
        "x",
        AIM,
        [note],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print_table([row(args.messages, args.rounds)])


if __name__ == "__main__":
    main()
