"""The HTTP API's shapes that only node agents and their routes use (`reconciler agent` and
server/agents.py): the heartbeat, the header naming the agent process, the reports of a
run's start and end, and the ended runs whose folders an agent asks about. The rest of the
API's shapes are wire.py's."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .wire import Body, Int64, NonNegativeInt64


class Capacity(Body):
    slots: NonNegativeInt64 | None = Field(default=None, description="Default: the node's CPU count.")
    cpu: str | None = None
    memory: str | None = None


# which agent process (host:pid:start, as its heartbeat names it) asks for a node's runs or
# reports on them: the server refuses (409) one that does not serve the node
AGENT_HEADER = "X-Reconciler-Agent"
# sent by an agent that needs no answer of its long poll when a run whose end it reported
# leaves its node (it acts again on an answer it holds only for the runs it skipped then, so
# a run it ended is never started again from an answer the server no longer gives)
QUIET_ENDS_HEADER = "X-Reconciler-Quiet-Ends"


class HeartbeatRequest(Body):
    """POST nodes/{name}/heartbeat: a node agent registers its Node (first beat) and keeps it
    Ready. Labels and capacity are the agent's word for a Node it registered; a Node applied
    from a manifest keeps the manifest's."""

    agent: str = Field(description="The agent process (host:pid:start).")
    labels: dict[str, str] = Field(default_factory=dict)
    capacity: Capacity = Field(default_factory=Capacity)
    cpu_count: Int64 = Field(default=1, ge=1)
    address: str = Field(description="Where this node's services and log port are reached.")
    log_port: int | None = Field(default=None, ge=1, le=65535)
    withdraws: bool = Field(
        default=False,
        description="The agent answers a stop of a run it has not started (Withdrawn); an older one does not.",
    )


class RunReport(Body):
    """POST nodes/{name}/runs/{job}/report: what the agent knows of one run, all of it each
    time (a start, then the same with its end). `epoch` names the admission; a report for
    one that is no longer current is refused (409) and the agent stops the process."""

    uid: str
    run: Int64 = Field(ge=1)
    epoch: Int64
    pid: Int64 | None = None
    process_start_time: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: Int64 | None = None
    signal: Int64 | None = None
    gone: bool = Field(default=False, description="The process is gone and left no exit record.")
    start_failed: str | None = Field(default=None, description="Why the run could not start (nothing ran).")
    start_reason: str | None = Field(
        default=None, description="StartFailed, ArtifactInvalid, or Withdrawn (stopped before it started)."
    )
    retryable: bool = Field(default=False, description="A failed start worth another attempt (URL unreachable).")
    ready: bool | None = Field(
        default=None, description="A service's readiness probe, run by the agent: passed or not."
    )
    ready_message: str | None = Field(default=None, description="The probe's diagnostic.")
    limits: str | None = Field(default=None, description="How the run's resources are held: cgroup v1|v2, rlimit.")
    degraded: str | None = Field(default=None, description="Why no cgroup holds the run.")
    peak_memory: Int64 | None = Field(default=None, description="The most memory its cgroup held at once (bytes).")
    cpu_seconds: float | None = Field(default=None, description="The CPU time its cgroup counted.")
    oom_kills: Int64 | None = Field(default=None, description="Processes the kernel killed at its memory limit.")

    def facts(self) -> dict[str, Any]:
        """The report as kept on the admission (camelCase, without what names the run)."""
        flags = {"gone", "retryable"}  # kept only when set
        return {
            k: v
            for k, v in self.model_dump(by_alias=True, exclude={"uid", "run", "epoch", "job"}).items()
            if v is not None and not (k in flags and v is False)
        }


class NamedRunReport(RunReport):
    """One run's report in a batch: the job it is of, and the report."""

    job: str


class RunReports(Body):
    """POST nodes/{name}/runs/reports: several runs' reports at once (as each of them would be
    posted to runs/{job}/report), kept in one transaction. Each is judged alone: the answer's
    `items` give, in order, 200 (kept) or 409 (its admission is no longer current: stop the
    process) for each."""

    items: list[NamedRunReport] = Field(max_length=1000)


class HeldRun(Body):
    """An ended run whose folder (logs and all) a node agent holds."""

    uid: str = Field(max_length=64)
    run: Int64 = Field(ge=1)
    node_uid: str = Field(max_length=64, description="The node's uid (its heartbeat's nodeUid) when the run started.")


class HeldRuns(Body):
    """POST nodes/{name}/runs/kept: which of these ended runs the store still keeps (their job
    exists; for a service, a run its status has not dropped; or the node is registered anew
    since, so this store cannot tell). The answer's `items` say, in order, `{"uid", "run",
    "kept"}`: the agent removes the folders of the runs not kept."""

    items: list[HeldRun] = Field(max_length=1000)
