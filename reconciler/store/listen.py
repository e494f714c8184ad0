"""Wake-ups of the change feed's followers. On PostgreSQL every write transaction that
allocates a resourceVersion sends `NOTIFY reconciler` (engine.Store.write) at its commit; one
thread per store LISTENs on a connection of its own and wakes whoever waits here, so a
follower (the controller's change watcher, the API's watch broadcaster) looks at the feed
within a millisecond or so of a commit instead of at its next poll. The poll stays, as the
safety net: a lost listening connection (reconnected with backoff), a notification missed
while reconnecting. SQLite has no such channel: its followers wait out the poll.

A notification's payload is `RV` or, for a controller's own write (`write(known=True)`),
`RV ORIGIN` with the writing store's token, so that store's change watcher is not woken for
what it wrote itself (it skips those writes anyway)."""

from __future__ import annotations

import logging
import os
import threading

from ..errors import InvalidInput

log = logging.getLogger("reconciler.store")

CHANNEL = "reconciler"
RECONNECT_MAX = 5.0  # seconds between attempts to listen again at most
_NOTIFIES_TIMEOUT = 1.0  # how often the listening thread looks whether it should stop


def listening() -> bool:
    """`RECONCILER_LISTEN=off` turns the notifications off: followers only poll. For a
    connection pooler in transaction mode (pgbouncer), which cannot keep a LISTEN, and for
    measuring what they bring (bench/wakeup.py)."""
    text = os.environ.get("RECONCILER_LISTEN", "on")
    if text not in ("on", "off"):
        raise InvalidInput(f"RECONCILER_LISTEN={text!r}: give on (the default) or off")
    return text == "on"


class Wakeups:
    """Two counters of announced changes, `every` and `foreign` (not the controller's own
    writes of this store): a follower waits until the one it follows moves past what it saw.
    Each counter has its own condition (on one lock), so that the controller's own writes,
    which are announced to every follower, do not wake its change watcher at each commit."""

    def __init__(self) -> None:
        lock = threading.Lock()
        self._conds = {False: threading.Condition(lock), True: threading.Condition(lock)}  # by `foreign`
        self._lock = lock
        self.every = 0
        self.foreign = 0

    def announce(self, *, foreign: bool) -> None:
        with self._lock:
            self.every += 1
            self._conds[False].notify_all()
            if foreign:
                self.foreign += 1
                self._conds[True].notify_all()

    def poke(self) -> None:
        """Wake every waiter (a follower stopping, a reconnection that may have missed changes)."""
        self.announce(foreign=True)

    def seen(self, *, foreign: bool) -> int:
        return self.foreign if foreign else self.every

    def wait(self, seen: int, timeout: float, *, foreign: bool) -> int:
        """Until the counter moves past `seen` or `timeout` passes; the counter now."""
        with self._lock:
            self._conds[foreign].wait_for(lambda: self.seen(foreign=foreign) != seen, timeout)
            return self.seen(foreign=foreign)


class Listener:
    """The thread that LISTENs on PostgreSQL and announces each notification."""

    def __init__(self, conninfo: str, wakeups: Wakeups, origin: str):
        self._conninfo = conninfo
        self._wakeups = wakeups
        self._origin = origin
        self._stop = threading.Event()
        self.listening = threading.Event()  # set while a LISTEN is in place
        self._thread = threading.Thread(target=self._run, name="store-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import psycopg  # only a PostgreSQL store listens

        delay = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    self._wakeups.poke()  # changes may have passed while it was not listening
                    delay = 0.1
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=_NOTIFIES_TIMEOUT):
                            _, _, origin = note.payload.partition(" ")
                            self._wakeups.announce(foreign=origin != self._origin)
            except Exception:  # the poll covers the gap; listen again after a pause
                self.listening.clear()
                if not self._stop.is_set():
                    log.info("not listening for store notifications; the poll covers it", exc_info=True)
                self._stop.wait(delay)
                delay = min(RECONNECT_MAX, delay * 2)
            finally:
                self.listening.clear()
