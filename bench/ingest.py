"""Figure 15: ingestion from RabbitMQ (the machine's broker, amqp://guest:guest@127.0.0.1:5672/)
into stored jobs, against a plain pika consumer that only acknowledges, in the same run.

- reconciler: M messages (the seed's job request, each with its own message id) are published
  to a fresh queue, then a `reconciler controller` process over a fresh SQLite store consumes
  them through a Source (its template suspends the jobs, so no run competes for the CPU; the
  change watcher still reads each new job's change, and the loop, told by the lane that a job
  stored suspended is at rest, does not look at it: controller/settled.py). Timed: from the
  controller's start until another process reading the store (every 5 ms) counts M jobs. The
  queue is then checked empty (every message acknowledged).
- reference: the same M messages in another fresh queue, drained by a plain pika consumer
  process (basic_consume, the same prefetch, basic_ack per message, nothing else). Timed:
  from its start to its exit.

Each side also drains a queue of M/5 the same way, and its rate is (M - M/5) / (the wall
time of the run of M - that of the run of M/5): what a run pays once (the interpreter,
imports, connecting, the first look at the store) cancels out, and nothing is taken from
the store's own records. Three rounds, each round's four runs within a minute; the medians,
and the figure is the median of the rounds' ratios (this machine's speed moves within a
minute). The aim: at least half the plain consumer's rate. Beside the rates, each side's
CPU time a message by the same difference (the controller's whole process, read from /proc
when the last job is seen; the consumer's from its exit): on a machine other work loads, the
wall-clock rates move with the load, the CPU a message less.

    .venv/bin/python bench/ingest.py [--messages 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
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
SMALL_SHARE = 5  # the smaller run of each pair holds a fifth of the messages
POLL = 0.005  # seconds between the looks at the store for the stored jobs


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


def _consume(queue: str, count: int) -> None:
    """The plain consumer, run as its own process by `plain`: acknowledge `count` messages, exit."""
    from reconciler.controller.amqp import PREFETCH

    connection, channel = _channel()
    seen = 0

    def on_message(ch, method, _properties, _body) -> None:
        nonlocal seen
        ch.basic_ack(method.delivery_tag)
        seen += 1
        if seen == count:
            ch.stop_consuming()

    try:
        channel.basic_qos(prefetch_count=PREFETCH)
        channel.basic_consume(queue, on_message_callback=on_message)
        channel.start_consuming()
    finally:
        connection.close()


@dataclass(frozen=True)
class Timed:
    """One whole run: its wall time (seconds) and its process's CPU time (seconds)."""

    wall: float
    cpu: float


def plain(count: int) -> Timed:
    """A plain pika consumer's process, from its start to its exit, draining a queue of `count`."""
    queue = _fill(count)
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--consume", queue, str(count)], check=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        _check_drained(queue)
    finally:
        _drop(queue)
    return Timed(wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _check_drained(queue: str) -> None:
    """Its consumer is gone: what it had not acknowledged would be back in the queue."""
    connection, channel = _channel()
    try:
        left = channel.queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()
    if left:
        raise AssertionError(f"ingest: {left} messages not acknowledged")


def reconciler(count: int) -> Timed:
    """A `reconciler controller` process, from its start until `count` queued job requests are
    jobs in its store (as another process reading the store sees them)."""
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
            jobs = Statement("SELECT count(*) FROM objects WHERE kind = 'Job'")
            deadline = time.monotonic() + max(60.0, count / 50)
            start = time.perf_counter()
            controller = subprocess.Popen(
                [sys.executable, "-m", "reconciler", "controller"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                while True:
                    with store.read() as session:
                        stored = jobs.execute(session).scalar()
                    if stored >= count:
                        wall = time.perf_counter() - start
                        cpu = _cpu_seconds(controller.pid)
                        break
                    if time.monotonic() > deadline or controller.poll() is not None:
                        raise TimeoutError(f"ingest: {stored} of {count} jobs stored")
                    time.sleep(POLL)
            finally:
                controller.terminate()
                controller.wait(30)
                store.dispose()
            _check_drained(queue)
            if stored != count:
                raise AssertionError(f"ingest: {stored} jobs for {count} messages")
            return Timed(wall, cpu)
    finally:
        _drop(queue)


@dataclass(frozen=True)
class Rate:
    """Messages/s, and CPU seconds a message (the consumer's whole process: every thread),
    each from the difference between a run of many messages and a smaller one, so that
    what a run pays once (interpreter, imports, connecting) cancels out."""

    per_second: float
    cpu: float
    fixed: float  # seconds of the smaller run's wall time that are not its messages'
    whole: float  # messages/s of the larger run's whole wall time, its fixed costs included


def rate(measure, count: int, small: int) -> Rate:
    big, little = measure(count), measure(small)
    spent = big.wall - little.wall
    # at a size this small that the two runs' fixed costs differ by more than the messages
    # between them take (CI's), there is no rate to tell: nan, not a negative one
    per_second = (count - small) / spent if spent > 0 else float("nan")
    return Rate(
        per_second, (big.cpu - little.cpu) / (count - small), little.wall - small / per_second, count / big.wall
    )


def row(count: int, rounds: int = 3) -> Row:
    small = max(1, count // SMALL_SHARE)
    ours: list[Rate] = []
    theirs: list[Rate] = []
    for i in range(rounds):  # interleaved: this machine's speed drifts within a minute
        log(
            f"ingest: round {i + 1} of {rounds}: {count} and {small} messages by a plain pika consumer, "
            "then by a Source"
        )
        theirs.append(rate(plain, count, small))
        ours.append(rate(reconciler, count, small))
    from reconciler.controller.amqp import BATCH

    # the rounds where both rates could be told (at CI's size the fixed costs' noise can
    # exceed the messages' time); if none, the whole runs' rates, fixed costs included
    told = [(p, o) for p, o in zip(theirs, ours, strict=True) if math.isfinite(p.per_second + o.per_second)]
    field = "per_second" if told else "whole"
    pairs = told or list(zip(theirs, ours, strict=True))
    ours_rate = median([getattr(o, field) for _, o in pairs])
    plain_rate = median([getattr(p, field) for p, _ in pairs])
    # each round's runs are a minute apart at most: their ratio is what this machine can tell
    ratio = median([getattr(p, field) / getattr(o, field) for p, o in pairs])
    fallback = (
        ""
        if told
        else f"; in no round could the difference be told, so the figures are the whole runs of {count} (fixed costs"
        " included)"
    )

    def listed(rates: list[Rate], field: str, scale: float, spec: str) -> str:
        return ", ".join(format(getattr(r, field) * scale, spec) for r in rates)

    label = "15 ingestion from RabbitMQ (sqlite)"
    note = (
        f"{label}: {count} job requests waiting in a queue, drained by a `reconciler controller` process "
        f"into stored jobs through a Source (batches of up to {BATCH} a transaction, then one acknowledgement "
        f"a batch) and by a plain pika consumer process acknowledging each, {rounds} round(s) interleaved; "
        f"rates by wall time, (the run of {count} - the run of {small}) / {count - small} messages: "
        f"{ours_rate:.0f} messages/s ({listed(ours, 'per_second', 1, '.0f')}) against the plain consumer's "
        f"{plain_rate:.0f}/s ({listed(theirs, 'per_second', 1, '.0f')}); per round, ours/plain "
        f"{', '.join(f'{o.per_second / p.per_second:.0%}' for o, p in zip(ours, theirs, strict=True))}: "
        f"median {1 / ratio:.0%} of its rate (aim: at least half){fallback}. Fixed costs (start, imports, connecting): "
        f"{listed(ours, 'fixed', 1, '.2f')} s against {listed(theirs, 'fixed', 1, '.2f')} s. CPU a message, "
        f"the controller process {median([r.cpu for r in ours]) * 1e6:.0f} us ({listed(ours, 'cpu', 1e6, '.0f')}) "
        f"against the plain consumer's {median([r.cpu for r in theirs]) * 1e6:.0f} us "
        f"({listed(theirs, 'cpu', 1e6, '.0f')})"
    )
    return Row(
        label,
        f"{ours_rate:.0f} messages/s into stored jobs",
        f"plain pika consumer {plain_rate:.0f}/s",
        ratio,
        "x",
        AIM,
        [note],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--consume", nargs=2, metavar=("QUEUE", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.consume:
        _consume(args.consume[0], int(args.consume[1]))
        return
    print_table([row(args.messages, args.rounds)])


if __name__ == "__main__":
    main()
