"""Leader election among the `serve` processes sharing a store: one holds the controller
lease (store/lease.py) and runs the reconcile loop; the others answer the API and take over
once the lease expires (or at once, when it was released or its holder is proven gone on
this host).

The leader renews the lease every third of its period. Its controller's writes check the
term inside their transaction (transactions.Fence), so once another server has taken the lease a
former leader cannot write: its steps fail with `Fenced`, and it stops its controller and
becomes a follower again. A renewal that fails (the database unreachable) is retried; the
controller stops when the lease may have run out unseen (its `valid_until`). Its runs are
left alone: on this host the next leader adopts them (owners.py), elsewhere they are a lost
node's runs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..agent.local import owner_gone, process_owner
from ..errors import first_line
from ..store import Store, StoreError
from ..store import lease as leases
from ..store.transactions import Fence
from ..threads import critical

log = logging.getLogger("reconciler.leader")

LEASE_PERIOD = 15.0  # seconds; `serve --lease`
TICK = 0.25  # how often the election thread looks at its fence and timers


class Running(Protocol):
    def stop(self, *, drain: bool = True) -> None: ...


def _broken() -> Fence:
    fence = Fence(0, 0.0)
    fence.broken.set()
    return fence


class Leadership:
    """`lead(term)` starts the controller of a won term and returns it; it is stopped when
    the term ends. Until it leads, the store's fence refuses the controller's writes."""

    def __init__(
        self, store: Store, lead: Callable[[int], Running], *, period: float = LEASE_PERIOD, holder: str | None = None
    ):
        """`holder`: who this server is in the lease (this process, `host:pid:start`, unless a
        test runs two elections in one process)."""
        self.store = store
        self.period = period
        self.holder = holder or process_owner()
        self._lead = lead
        self._running: Running | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the running controller, between the thread and stop()
        self._thread = critical("leader-election", self._run)
        store.fence = _broken()

    @property
    def running(self) -> Running | None:
        """The controller of the term this server leads in; None while it follows."""
        return self._running

    @property
    def term(self) -> int | None:
        fence = self.store.fence
        return fence.term if fence is not None and self._running is not None else None

    def start(self) -> Leadership:
        """A first campaign before returning (a lone server leads before it answers), then
        the election thread."""
        self._campaign()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the controller and release the lease, so that another server takes over at once."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(5)
        term = self.term
        self._step_down("this server is stopping", drain=True)
        if term is not None:
            try:
                with self.store.write() as tx:
                    leases.release(tx, self.holder, term)
            except StoreError:
                log.warning("could not release the controller lease; another server takes it when it expires")

    def describe(self) -> dict[str, Any]:
        """Who leads, as `/leader` shows it: this server's view and the lease row."""
        with self.store.read() as conn:
            current = leases.read(conn)
        term = self.term
        leading = current is not None and current.holder == self.holder and current.term == term
        return {
            "leader": leading,
            "server": self.holder,
            "holder": None if current is None else current.holder,
            "term": None if current is None else current.term,
            "expiresIn": None if current is None else round(max(current.expires_in, 0.0), 3),
            "termAge": None if current is None else round(current.now - current.acquired_at, 3),
            "leaseSeconds": self.period,
        }

    # -- the election thread ---------------------------------------------------------------
    def _run(self) -> None:
        next_look = time.monotonic()
        while not self._stop.wait(TICK):
            fence = self.store.fence
            now = time.monotonic()
            if self._running is not None and fence is not None and fence.broken.is_set():
                self._step_down("a write found another term: another server leads")
                next_look = now + self.period / 15
            elif now < next_look:
                continue
            elif self._running is None:
                next_look = now + self._campaign()
            else:
                next_look = now + self._renew()

    def _campaign(self) -> float:
        """Take the lease if it is free; seconds until the next look: a fifteenth of the
        period (1 s at 15 s), or less when the leader's lease runs out sooner, so that a
        dead leader is replaced within a tick of its lease's end."""
        look = self.period / 15
        try:
            with self.store.read() as conn:
                current = leases.read(conn)
            gone = None
            if current is not None and current.holder is not None:
                # this process's own older term (it stepped down), or a holder dead on this host
                if current.holder == self.holder or owner_gone(current.holder):
                    gone = current.holder
                elif current.expires_in > 0:
                    return min(look, current.expires_in + TICK / 5)  # another server leads
            started = time.monotonic()
            with self.store.write() as tx:
                term = leases.take(tx, self.holder, self.period, gone=gone)
        except StoreError as exc:  # the database is away: one line a look, not a traceback
            log.warning("could not look at the controller lease (%s); trying again", first_line(exc))
            return look
        if term is None:  # another server was quicker, or the lease had a moment left: look again soon
            return TICK
        self.store.fence = Fence(term, started + self.period)
        log.info("leading as term %d (lease %gs)", term, self.period)
        try:
            running = self._lead(term)
        except StoreError:
            log.warning("the controller of term %d could not start; stepping down", term, exc_info=True)
            self.store.fence.broken.set()
            return look
        with self._lock:
            self._running = running
        return look

    def _renew(self) -> float:
        """Renew the lease; seconds until the next look."""
        fence = self.store.fence
        assert fence is not None
        started = time.monotonic()
        try:
            with self.store.write() as tx:
                kept = leases.renew(tx, self.holder, fence.term, self.period)
        except StoreError as exc:
            if not fence.holds():
                self._step_down("the controller lease could not be renewed within its period")
                return self.period / 15
            log.warning("could not renew the controller lease (%s); trying again", first_line(exc))
            return 1.0
        if not kept:
            self._step_down("the controller lease changed hands")
            return self.period / 15
        fence.valid_until = started + self.period
        return self.period / 3

    def _step_down(self, why: str, *, drain: bool = False) -> None:
        fence = self.store.fence
        if fence is not None:
            fence.broken.set()  # from here every write of the controller is refused
        with self._lock:
            running, self._running = self._running, None
        if running is None:
            return
        if not drain:
            log.warning("stepping down from term %s: %s", None if fence is None else fence.term, why)
        running.stop(drain=drain)
