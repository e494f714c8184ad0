"""The agent's heartbeat and its lease: a thread posting its Node's heartbeat, which is how
the server counts the node Ready and knows which agent serves it. An accepted heartbeat
lets the other threads act (until then this agent may be a duplicate) and renews the lease
that starts depend on; a refused one ends the agent (another agent serves the node, or
its token is wrong)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from .api import Stale, Unauthorized, Unreachable
from .shared import BACKOFF_FIRST, BACKOFF_MAX, TICK, Shared, jitter

log = logging.getLogger("reconciler.agent")

HEARTBEAT_INTERVAL = float(os.environ.get("RECONCILER_HEARTBEAT_INTERVAL", "10"))
READY_WINDOW = 40.0  # the server's Ready window (README), when its heartbeat answer does not say it


class Heartbeat(Shared):
    def _beat(self) -> None:
        delay = BACKOFF_FIRST
        while not self._stop.is_set():
            try:
                sent = time.monotonic()
                answer = self.api.heartbeat(self._beat_body())
                said = answer.get("readyWindowSeconds")
                window = float(said) if isinstance(said, int | float) and said > 0 else READY_WINDOW
                with self._lock:
                    if self._accepted.is_set() and sent > self._lease_until:
                        # the lease ran out meanwhile: an answer the long poll gave before may
                        # place runs the server has since given elsewhere; only a newer one starts
                        self._fresh_after = sent
                    self._lease_until = sent + window
                    if isinstance(registered := answer.get("nodeUid"), str):
                        self._node_uid = registered  # recorded with each run started from now on
                delay = BACKOFF_FIRST
                self._accepted.set()
                self._relook.set()  # a start that waited for an accepted heartbeat is taken now
                self._pending.set()  # back after an outage: what waited is sent now
                # a quarter of the window at most: a lease renewed well before it runs out
                self._stop.wait(min(HEARTBEAT_INTERVAL, window / 4))
            except Stale as exc:  # refused: another agent serves this node
                stopped = self._stop_runs()
                self.failed = str(exc) + (f"; stopped the {stopped} run(s) this agent held" if stopped else "")
                self._stop.set()
                return
            except Unauthorized as exc:  # not worth retrying: the token is wrong until someone fixes it
                self.failed = (
                    f"the server refused this agent's token for node {self.options.node} ({exc}): give --token or "
                    f"--token-file with the token of an `agent {self.options.node}` line of the server's tokens file"
                )
                self.exit_code = 2
                self._stop.set()
                return
            except Unreachable as exc:
                if exc.status == 422 and "withdraws" in str(exc) and self._says_withdraws:
                    # a server of the version before takes no such field: its nodes free a
                    # stopped run at once, so this agent need not say it answers such stops
                    log.warning("the server takes no `withdraws` in a heartbeat (an older version): left out")
                    self._says_withdraws = False
                    continue
                log.warning("heartbeat failed: %s (again in %.1fs)", exc, delay)
                self._stop.wait(jitter(delay))
                delay = min(delay * 2, BACKOFF_MAX)

    def _await_acceptance(self) -> bool:
        """Wait for this agent's first accepted heartbeat; False when it stops first."""
        while not self._accepted.wait(TICK):
            if self._stop.is_set():
                return False
        return True

    def _beat_body(self) -> dict[str, Any]:
        capacity = {
            k: v
            for k, v in (("slots", self.options.slots), ("cpu", self.options.cpu), ("memory", self.options.memory))
            if v is not None
        }
        body: dict[str, Any] = {
            "agent": self.owner,
            "labels": self.options.labels,
            "capacity": capacity,
            "cpuCount": os.cpu_count() or 1,
            "address": self.address,
            **({"withdraws": True} if self._says_withdraws else {}),  # a stop of a run never started is answered
        }
        if self.logs is not None:
            body["logPort"] = self.logs.port
        return body
