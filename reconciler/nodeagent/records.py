"""What the node agent knows of each run it started, kept in the run's folder
(`agent.json`) so that a restarted agent adopts live runs and reports the ends it missed:
which admission (job, uid, run, epoch) the run belongs to, its process identity, its end,
and which of its reports the server has taken."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..agent.local import ProcessIdentity

RECORD = "agent.json"


@dataclass
class Record:
    job: str
    uid: str
    run: int
    epoch: int
    dir: str
    pid: int | None = None
    process_start_time: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    gone: bool = False
    start_failed: str | None = None  # why it could not start
    start_reason: str | None = None  # StartFailed, or ArtifactInvalid
    retryable: bool = False  # a start that failed, worth another attempt (an artifact's URL unreachable)
    ready: bool | None = None  # a service's readiness probe, run here: its last verdict
    cgroup: str | None = None  # the run's cgroup (by name), when it has one
    limits: str | None = None  # how its resources are held: cgroup v1 | cgroup v2 | rlimit
    degraded: str | None = None  # why no cgroup holds it
    peak_memory: int | None = None  # what its cgroup counted, once it ended
    cpu_seconds: float | None = None
    oom_kills: int | None = None  # processes the kernel killed at its memory limit
    ready_message: str | None = None
    start_reported: bool = False
    end_reported: bool = False
    stale: bool = False  # the server refused a report (409): the admission is no longer current
    grace: float = 10.0  # the job's stopGracePeriod
    stop_at: float | None = None  # monotonic time a stop began (SIGTERM sent)
    # the Node's uid when the run was taken on (its registration in the server's store): only
    # that store's word that the run is no longer kept lets its folder go (sweep.py)
    node_uid: str | None = None

    @property
    def identity(self) -> ProcessIdentity | None:
        if self.pid is None or self.process_start_time is None:
            return None
        return ProcessIdentity(self.pid, self.process_start_time)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def settled(self) -> bool:
        """Nothing more to tell the server, nothing running."""
        return self.finished and (self.end_reported or self.stale)

    def report(self) -> dict[str, Any]:
        """The run report (agentwire.RunReport) of all this record knows."""
        facts = {
            "pid": self.pid,
            "processStartTime": self.process_start_time,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "exitCode": self.exit_code,
            "signal": self.signal,
            "startFailed": self.start_failed,
            "startReason": self.start_reason,
            "ready": self.ready,
            "readyMessage": self.ready_message,
            "limits": self.limits,
            "degraded": self.degraded,
            "peakMemory": self.peak_memory,
            "cpuSeconds": None if self.cpu_seconds is None else round(self.cpu_seconds, 3),
            "oomKills": self.oom_kills or None,
        }
        body: dict[str, Any] = {"uid": self.uid, "run": self.run, "epoch": self.epoch}
        body.update({k: v for k, v in facts.items() if v is not None})
        if self.gone:
            body["gone"] = True
        if self.retryable:
            body["retryable"] = True
        return body

    def save(self) -> None:
        """Written whole and renamed into place: a crash of the agent leaves the old record or
        the new. Not fsynced (it is written twice per run, on the path from one run's end to
        the next one's start): a machine that loses it lost its runs too, and a run the server
        holds a start of, and this node has no record of, is reported gone."""
        path = Path(self.dir) / RECORD
        tmp = path.with_name(f".{RECORD}.{threading.get_ident()}")  # threads save a record each under its own name
        document = {k: v for k, v in vars(self).items() if k != "stop_at"}  # flat: no asdict deep copy
        # private, as every state file is (its folder is too)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write(json.dumps(document))  # one write, not a chunk per token
        os.replace(tmp, path)


def load(folder: Path) -> Record | None:
    """The record in a run's folder, if there is a readable one."""
    known = {f.name for f in fields(Record)}
    try:
        document = json.loads((folder / RECORD).read_text())
        record = Record(**{k: v for k, v in document.items() if k in known})
    except (OSError, ValueError, TypeError):
        return None  # none, or one written by hand or by another version: not ours to act on
    # the run can write its folder: an integer no report may carry (wire.Int64) would have
    # the server refuse, and the agent resend, every batch of reports it is in
    if any(isinstance(v, int) and not -(2**63) <= v < 2**63 for v in vars(record).values()):
        return None
    return record


def load_all(runs: Path) -> list[Record]:
    """The records of runs not yet settled, found in the run folders."""
    found = (load(path.parent) for path in runs.glob(f"*/{RECORD}"))
    return [record for record in found if record is not None and not record.settled]
