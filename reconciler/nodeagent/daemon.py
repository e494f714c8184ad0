"""`reconciler agent`: a node on another machine. It dials out to the server: posts its Node's
heartbeat, follows the runs placed on its node (a long poll answered as soon as they
change, but for a run leaving whose end it reported), starts each under the crash-safe
wrapper the controller's own agent uses, and reports start and end; it stops what the
server asks to stop, and what the server no longer counts (a report refused with 409). It
keeps no store: what it must remember across a restart is in each run's folder
(records.py).

The agent is `NodeAgent`: the state its threads share (shared.py) with one part mixed in
per thread or purpose: heartbeat.py (heartbeat and lease), follow.py (the long poll and
the look at each answer), starts.py (starting or withdrawing a run), ends.py (a run's
end), stops.py (stops, SIGTERM then SIGKILL), reports.py (reports to the server),
sweep.py (removing the folders of ended runs the server no longer keeps). Here is its life:
adopting the runs found in the state dir, starting the threads, stopping."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .ends import Ends
from .follow import Follow
from .heartbeat import Heartbeat
from .logserver import LogServer
from .records import Record, load_all
from .reports import Reports
from .starts import Starts
from .stops import Stops
from .sweep import Sweep

log = logging.getLogger("reconciler.agent")


@dataclass
class Options:
    server: str
    node: str
    state_dir: Path
    token: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    slots: int | None = None
    cpu: str | None = None
    memory: str | None = None
    log_port: int | None = None
    log_host: str = "0.0.0.0"
    address: str | None = None
    verify: bool | str = True


class NodeAgent(Heartbeat, Follow, Starts, Ends, Stops, Reports, Sweep):
    """The node agent: its parts (one module each) over the state they share (shared.py); its
    life is here."""

    def start(self) -> NodeAgent:
        for record in load_all(self.options.state_dir / "runs"):
            self._adopt(record)
        if self.options.log_port is not None:
            self.logs = LogServer(
                self.options.log_host,
                self.options.log_port,
                self.options.state_dir / "runs",
                self.options.token,
                self._finished,
            ).start()
        for name, target in (
            ("heartbeat", self._beat),
            ("runs", self._follow),
            ("reports", self._report),
            ("stops", self._tick),
            ("sweep", self._sweep),
        ):
            thread = threading.Thread(target=self._guarded, args=(name, target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _guarded(self, name: str, loop: Callable[[], None]) -> None:
        """A loop of the agent that must not end: an unexpected error is logged, and the loop
        starts again a moment later (each loop keeps its state in the records, not the stack)."""
        while not self._stop.is_set():
            try:
                loop()
            except Exception:
                log.exception("the agent's %s loop failed; starting it again", name)
                self._pending.set()
                self._stop.wait(1.0)

    def stop(self) -> None:
        """The agent stops; its runs go on (a restarted agent adopts them)."""
        self._stop.set()
        self._pending.set()
        if self.logs is not None:
            self.logs.stop()
        for thread in self._threads:
            thread.join(2)
        self.probes.close()
        self.local.close()
        self.api.close()

    def wait(self) -> None:
        self._stop.wait()

    def _adopt(self, record: Record) -> None:
        """A run found in the state dir at start: watched if alive, its end read if not."""
        self._keep(record)
        identity = record.identity
        if record.finished:
            self._pending.set()
            return
        if identity is not None and self.local.wrapper_alive(identity):
            self.local.watch(record.job, identity)  # its end is recorded when the watcher calls
            log.info("adopted run %d of job %s (pid %d)", record.run, record.job, identity.pid)
        else:
            self._record_end(record)
        self._pending.set()


def default_state_dir(node: str) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "reconciler" / f"agent-{node}"
