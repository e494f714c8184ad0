"""What the parts of the node agent share: the state its threads read and change under one
lock (the runs it holds, its lease, the long poll's last answer, the events they wake each
other with), the pacing they have in common, and the calls one part makes into another.
`NodeAgent` (daemon.py) is this state with each part mixed in; a part is a module beside
this one (heartbeat, follow, starts, ends, stops, reports), so each reads on its own."""

from __future__ import annotations

import random
import socket
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..agent.local import LocalAgent, process_owner
from ..agent.probe import Probes
from ..api.job import WaitCondition
from .api import Api
from .logserver import LogServer
from .records import Record

if TYPE_CHECKING:
    from .daemon import Options

BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0  # reconnecting to a server that does not answer
TICK = 0.1  # stops in progress (SIGKILL after the grace period) are looked at this often


class Shared(ABC):
    """The agent's state, as each of its parts sees it; `NodeAgent` is it with the parts mixed in."""

    def __init__(self, options: Options):
        self.options = options
        self.owner = process_owner()
        self.api = Api(options.server, options.node, options.token, options.verify, agent=self.owner)
        self.local = LocalAgent(options.node, options.state_dir, on_exit=self._exited)
        self.address = options.address or _route_to(options.server)
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}  # job -> its run on this node still to settle
        self._by_folder: dict[str, Record] = {}
        self._preparing: dict[str, dict[str, Any]] = {}  # job -> its item, while its artifact is fetched
        # job -> (uid, probe, cwd, the job's env)
        self._readiness: dict[str, tuple[str, WaitCondition, str | None, dict[str, str]]] = {}
        self.probes = Probes(wake=lambda _job: None)  # looked at on each tick: nothing to wake
        self._specified: set[str] = set()  # run folders whose spec this process has acted on
        self._pending = threading.Event()  # reports to send
        self._batches = True  # the server takes several reports in one request (runs/reports)
        self._quiet_until: dict[str, float] = {}  # run folder -> when its start is reported, unless it ends first
        self._ended: dict[str, tuple[str, int, str]] = {}  # run folder -> a settled record's run (sweep.py)
        self._node_uid: str | None = None  # the Node's uid, as the last accepted heartbeat said: its registration
        self._stop = threading.Event()
        # set once a heartbeat is accepted: until then this agent may be a duplicate of the one
        # serving its node, and it learns of no run, starts none and reports none
        self._accepted = threading.Event()
        # a lease: runs start only until the last accepted heartbeat, as sent, is older than the
        # server's Ready window; past it another host's agent may have taken the node over
        self._lease_until = 0.0  # time.monotonic()
        self._replaced = False  # another agent serves the node: this one starts nothing more
        self._fresh_after = 0.0  # time.monotonic(): runs start only from answers received after it
        self._received = 0.0  # when the long poll's last answer came
        self._says_withdraws = True  # off for a server of the version before (it refuses the field)
        self._reconciling = threading.Lock()  # one look at the placed runs at a time
        self._last_items: list[dict[str, Any]] | None = None  # the long poll's last answer
        # jobs whose admission waits (an older run's record to settle, a lease, a start not known)
        self._skipped: set[str] = set()
        self._relook = threading.Event()  # a record settled: look at the skipped runs of the last answer again
        self._threads: list[threading.Thread] = []
        self.logs: LogServer | None = None
        self.failed: str | None = None  # why the agent gave up (its node is another agent's, a bad token)
        self.exit_code = 1  # with `failed`: 1 the node is another agent's, 2 bad configuration (token)

    def _keep(self, record: Record) -> None:
        with self._lock:
            self._records[record.job] = record
            self._by_folder[Path(record.dir).name] = record

    # what one part of the agent asks of another: each is defined in its part's module
    @abstractmethod
    def _await_acceptance(self) -> bool: ...  # heartbeat.py

    @abstractmethod
    def _look_again(self) -> None: ...  # follow.py

    @abstractmethod
    def _start(self, item: dict[str, Any]) -> None: ...  # starts.py

    @abstractmethod
    def _withdraw(self, item: dict[str, Any]) -> None: ...  # starts.py

    @abstractmethod
    def _adopted_spec(self, record: Record, item: dict[str, Any]) -> None: ...  # starts.py

    @abstractmethod
    def _forgotten(self, item: dict[str, Any]) -> None: ...  # starts.py

    @abstractmethod
    def _exited(self, job: str) -> None: ...  # ends.py

    @abstractmethod
    def _record_end(self, record: Record) -> None: ...  # ends.py

    @abstractmethod
    def _begin_stop(self, record: Record, reason: str | None) -> None: ...  # stops.py

    @abstractmethod
    def _stop_runs(self) -> int: ...  # stops.py


def jitter(delay: float) -> float:
    return delay * (0.8 + 0.4 * random.random())


def _route_to(server: str) -> str:
    """The address of this machine on the way to the server: where the server reaches its
    log port and the registry sends clients of its services."""
    url = urlsplit(server)
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
    try:
        family = socket.getaddrinfo(host, port)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # a UDP connect sends nothing: the kernel picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
