"""Delivery of the outbox (notices.py writes it) to notifiers, beside the reconcile loop.

Each notifier has a lane: a thread of its own that delivers its due events one at a time,
oldest first, so a slow or dead receiver holds back nobody else's (and no job: the events
were written with the job's status, and nothing in a reconcile step waits for them). A
failed attempt sets the event's next attempt (1s, doubling, at most 5m apart) and pauses the
whole lane by the same rule counted over its consecutive failures, so a dead receiver gets
one attempt per step of backoff, not one per pending event. An event still failing 24h after
it happened is given up (failed, with its last error). A lease per notifier keeps two
controllers on one store from delivering every event twice."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import telemetry
from ..api.notifier import NotifierSpec
from ..api.source import shown_url
from ..clock import Clock
from ..store import outbox
from ..threads import critical
from .owners import released

if TYPE_CHECKING:
    from ..store import Store
    from ..store.dbapi import Row
    from ..store.transactions import Tx

log = logging.getLogger("reconciler.notify")

TIMEOUT = 10.0  # one delivery: an HTTP request or a command
FIRST_RETRY = 1.0
MAX_RETRY = 300.0
GIVE_UP_AFTER = 24 * 3600.0  # counted from the event
POLL = 1.0  # a lane looks at the outbox at least this often (events written by other processes)
LEASE = 30.0  # longer than one delivery can take
BATCH = 100  # events read at once; their results are written together
FLUSH_AFTER = 0.5  # seconds of deliveries before their results are written, whatever the batch
ERROR_PAUSE = 1.0  # after the store failed a lane's step


def retry_delay(failures: int) -> float:
    """After the n-th failed attempt in a row: 1s, 2s, 4s ... at most 5m."""
    return min(MAX_RETRY, FIRST_RETRY * 2.0 ** min(failures - 1, 30))


class DeliveryFailed(Exception):
    """One attempt did not deliver; the message is what `describe notifier` shows."""


def signature(key: bytes, body: bytes) -> str:
    """X-Reconciler-Signature: sha256=<hex HMAC-SHA256 of the exact body>."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def _secret(path: str) -> bytes:
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise DeliveryFailed(f"secretRef file {path}: {exc.strerror or exc}") from None
    return key[:-1] if key.endswith(b"\n") else key


class Connections:
    """A lane's HTTP client, kept for the lane's life (its connections are reused: keep-alive),
    and the sockets of those connections, so that an attempt can be ended at its deadline:
    httpx bounds each read, not the whole request (encode/httpx#1450), and a receiver that
    trickles its header lines would hold the lane as long as it likes. The sockets are learned
    from httpcore's trace as each connection is made, and again once TLS wraps it (a reused
    one was made by an earlier attempt of this lane, which traced it too). A deadline cuts
    only while its own attempt is the lane's current one: a late timer never cuts the next."""

    def __init__(self) -> None:
        import httpx  # imported once a notifier has a URL (a tenth of a second at start-up otherwise)

        self.client = httpx.Client(timeout=TIMEOUT, headers={"User-Agent": "reconciler"})
        self._streams: weakref.WeakSet[Any] = weakref.WeakSet()
        self._guard = threading.Lock()
        self._attempt = 0  # the attempt a deadline may cut; another number: none

    def trace(self, event: str, info: dict[str, Any]) -> None:
        # the TCP stream, and the TLS one that replaces it (the plain one is then dropped)
        stream = info.get("return_value")
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete") and stream is not None:
            self._streams.add(stream)

    def begin(self) -> int:
        with self._guard:
            self._attempt += 1
            return self._attempt

    def end(self) -> None:
        with self._guard:
            self._attempt += 1  # its deadline, should its timer run late, cuts nothing

    def cut(self, attempt: int) -> None:
        """Shut every connection down if `attempt` is still in flight: a read blocked on one
        returns at once (closing the socket would not wake it). The lane's only request in
        flight is among them; idle ones are found closed and made anew."""
        with self._guard:
            if attempt != self._attempt:
                return
            for stream in list(self._streams):
                sock = stream.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.client.close()


def post(conns: Connections, spec: NotifierSpec, body: str, event_id: str) -> None:
    import httpx

    assert spec.url is not None
    shown = shown_url(spec.url)  # errors are shown and logged: no password in them
    content = body.encode()
    headers = {"Content-Type": "application/json", "X-Reconciler-Event": event_id}
    if spec.secret_ref is not None:
        headers["X-Reconciler-Signature"] = signature(_secret(spec.secret_ref.file), content)
    # the whole attempt ends by TIMEOUT (API.md), whatever the receiver sends meanwhile
    expired = threading.Event()
    attempt = conns.begin()

    def at_deadline() -> None:
        expired.set()
        conns.cut(attempt)

    watchdog = threading.Timer(TIMEOUT, at_deadline)
    watchdog.daemon = True
    watchdog.start()
    try:
        # the answer is its status (a failure to get it is one of the request); the body is read
        # to its end so the connection serves the next event, but not past the deadline (the
        # watchdog cuts it): a receiver that trickles a body must not hold the lane for ever,
        # and one that breaks off its body has answered
        stream = conns.client.stream(
            "POST", spec.url, content=content, headers=headers, extensions={"trace": conns.trace}
        )
        with stream as response, contextlib.suppress(httpx.HTTPError):
            for _ in response.iter_raw():
                pass
    except httpx.HTTPError as exc:
        if expired.is_set() or isinstance(exc, httpx.TimeoutException):
            raise DeliveryFailed(f"POST {shown}: no answer within {TIMEOUT:g}s") from None
        raise DeliveryFailed(f"POST {shown}: {shown_url(str(exc)) or type(exc).__name__}") from None
    finally:
        watchdog.cancel()
        conns.end()
    if not response.is_success:
        raise DeliveryFailed(f"POST {shown}: HTTP {response.status_code} {response.reason_phrase}".rstrip())


def run_command(argv: list[str], body: str) -> None:
    """The event on stdin, no shell; exit 0 delivers. Killed with its process group at the
    timeout. Its stderr goes to a file, so a chatty command cannot fill our memory."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
        except OSError as exc:
            raise DeliveryFailed(f"{argv[0]}: cannot run: {exc.strerror or exc}") from None
        try:
            proc.communicate(body.encode(), timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise DeliveryFailed(f"{argv[0]}: still running after {TIMEOUT:g}s (killed)") from None
        if proc.returncode != 0:
            err.seek(max(0, err.seek(0, os.SEEK_END) - 300))
            last = err.read().decode(errors="replace").strip().splitlines()[-1:]
            said = f": {last[0]}" if last else ""
            raise DeliveryFailed(f"{argv[0]} exited with code {proc.returncode}{said}")


@functools.lru_cache(maxsize=256)
def _spec(text: str) -> NotifierSpec:
    return NotifierSpec.model_validate(json.loads(text))


class Lane:
    """One notifier's deliveries. `step` does one round; the Deliverer's thread calls it
    again when it says, and tests call it by hand with a fake clock."""

    def __init__(self, store: Store, name: str, *, clock: Clock, owner: str):
        self.store = store
        self.name = name
        self.clock = clock
        self.owner = owner
        self.failures = 0  # consecutive failed attempts: the lane's own backoff
        self.resume_at = 0.0
        self.gone = False  # the notifier was deleted: the lane ends
        self._client: Connections | None = None

    @property
    def client(self) -> Connections:
        """Kept for the lane's life: its connections are reused (keep-alive)."""
        if self._client is None:
            self._client = Connections()
        return self._client

    def step(self) -> float | None:
        """Deliver what is due now (one batch); returns in how many seconds there may be
        more to do, None when nothing is pending."""
        now = self.clock.now()
        if now < self.resume_at:
            return self.resume_at - now
        with self.store.read() as session:
            text = outbox.notifier_spec(session, self.name)
            if text is None:
                self.gone = True
                return None
            rows = outbox.due(session, self.name, now, BATCH)
            if not rows:
                soonest = outbox.next_due(session, self.name)
                return None if soonest is None else max(0.0, soonest - now)
            held = outbox.holder(session, self.name)
        if not self._leased(held, now):
            return POLL  # another controller delivers them
        done, failure = self._deliver(_spec(text), rows)
        now = self.clock.now()
        with self.store.write() as tx:
            outbox.delivered(tx, self.name, done, now)
            if failure is not None:
                self._failed(tx, *failure, now)
        if done:
            telemetry.NOTIFICATIONS.inc(self.name, "delivered", amount=len(done))
        if failure is not None:
            gave_up = now >= failure[0].created_at + GIVE_UP_AFTER
            telemetry.NOTIFICATIONS.inc(self.name, "failed" if gave_up else "retry")
        if failure is None:
            self.failures = 0
            return 0.0
        self.failures += 1
        self.resume_at = now + retry_delay(self.failures)
        return self.resume_at - now

    def _deliver(self, spec: NotifierSpec, rows: list[Row]) -> tuple[list[int], tuple[Row, str] | None]:
        """Send rows in order until one fails or FLUSH_AFTER has passed."""
        done: list[int] = []
        started = self.clock.monotonic()
        for row in rows:
            try:
                if spec.command is not None:
                    run_command(spec.command, row.body)
                else:
                    post(self.client, spec, row.body, row.event_id)
            except DeliveryFailed as exc:
                return done, (row, str(exc))
            done.append(row.id)
            if self.clock.monotonic() - started > FLUSH_AFTER:
                break
        return done, None

    def _failed(self, tx: Tx, row: Row, error: str, now: float) -> None:
        attempts = row.attempts + 1
        log.info("notifier %s: event %s, attempt %d failed: %s", self.name, row.event_id, attempts, error)
        if now >= row.created_at + GIVE_UP_AFTER:
            outbox.give_up(tx, self.name, row.id, error=error, now=now)
        else:
            outbox.retry(tx, self.name, row.id, attempts=attempts, at=now + retry_delay(attempts), error=error, now=now)
        # the rest of its 24h-old events go too, tried or not (the lane held them back)
        expired = f"not delivered within 24h; the receiver's last error: {error}"
        outbox.expire(tx, self.name, cutoff=now - GIVE_UP_AFTER, error=expired, now=now)

    def _leased(self, held: tuple[str, float] | None, now: float) -> bool:
        """Take or renew the notifier's lease, unless a live process holds it."""
        gone = None
        if held is not None and held[0] != self.owner:
            if held[1] > now and not released(held[0], self.owner):
                return False
            gone = held[0]
        elif held is not None and held[1] - now > LEASE / 2:
            return True  # ours, for a while yet
        with self.store.write() as tx:
            return outbox.lease(tx, self.name, self.owner, now=now, until=now + LEASE, gone=gone)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        try:
            with self.store.write() as tx:
                outbox.release(tx, self.name, self.owner)
        except Exception:  # the next owner waits out the lease
            log.debug("notifier %s: lease not released", self.name, exc_info=True)


class Deliverer:
    """The lanes: one thread per notifier, started when the notifier is seen, ended when it
    is deleted; `wake` after a write of events delivers them at once."""

    def __init__(self, store: Store, *, clock: Clock, owner: str):
        self.store = store
        self.clock = clock
        self.owner = owner
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._lock = threading.Lock()
        self._lanes: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._thread = critical("notifier-lanes", self._run)

    def start(self) -> Deliverer:
        self._thread.start()
        return self

    def wake(self) -> None:
        with self._lock:
            for _, woken in self._lanes.values():
                woken.set()
        self._woken.set()  # a notifier not seen yet

    def drain(self, timeout: float) -> None:
        """Wait (at most `timeout`) until no event is due: what `up` delivers before it exits."""
        deadline = time.monotonic() + timeout  # real time: a fake clock does not move by itself
        while time.monotonic() < deadline and self._due_now():
            self.wake()
            self._stop.wait(0.02)

    def _due_now(self) -> bool:
        now = self.clock.now()
        with self.store.read() as session:
            return any(
                (soonest := outbox.next_due(session, name)) is not None and soonest <= now
                for name, _ in outbox.notifiers(session)
            )

    def stop(self) -> None:
        self._stop.set()
        self.wake()
        self._thread.join(2)
        with self._lock:
            lanes = list(self._lanes.values())
        for thread, _ in lanes:
            thread.join(0.5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._woken.clear()
            try:
                with self.store.read() as session:
                    names = [name for name, _ in outbox.notifiers(session)]
            except Exception:  # the store may be briefly unavailable
                log.warning("notifier lanes: listing notifiers failed", exc_info=True)
                names = []
            with self._lock:
                for name in names:
                    lane = self._lanes.get(name)
                    if lane is None or not lane[0].is_alive():
                        woken = threading.Event()
                        thread = threading.Thread(target=self._lane, args=(name, woken), name=f"notify-{name}")
                        thread.daemon = True
                        self._lanes[name] = (thread, woken)
                        thread.start()
            self._woken.wait(POLL)

    def _lane(self, name: str, woken: threading.Event) -> None:
        lane = Lane(self.store, name, clock=self.clock, owner=self.owner)
        try:
            lane.client  # noqa: B018  # imports httpx now rather than while the first event waits
            while not self._stop.is_set() and not lane.gone:
                woken.clear()
                try:
                    delay = lane.step()
                except Exception:  # the store or a bug: never the reconcile loop's problem
                    log.warning("notifier %s: delivery round failed", name, exc_info=True)
                    delay = ERROR_PAUSE
                if delay is None or delay > POLL:
                    delay = POLL
                if delay > 0:
                    woken.wait(delay)
        finally:
            lane.close()
            with self._lock:
                mine = self._lanes.get(name)
                if mine is not None and mine[0] is threading.current_thread():
                    del self._lanes[name]
