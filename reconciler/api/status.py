"""Observed state, written only by the system (API.md 1.2). `phase` says what the system is
doing; `outcome` what the job came to, once Completed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .meta import Condition, Strict, Time

Phase = Literal["Waiting", "Queued", "Starting", "Running", "Backoff", "Stopping", "Suspended", "Completed"]
PHASES: tuple[str, ...] = ("Waiting", "Queued", "Starting", "Running", "Backoff", "Stopping", "Suspended", "Completed")
RunOutcome = Literal["Succeeded", "Failed", "TimedOut", "Cancelled", "StartFailed", "Lost"]


class Admission(Strict):
    pool: str | None = None
    slots: int
    admitted_at: Time


class RunRecord(Strict):
    number: int
    revision: int
    node: str | None = None
    pid: int | None = None
    process_start_time: float | None = Field(
        default=None, description="The run wrapper's start time: with pid, its identity."
    )
    started_at: Time | None = None
    finished_at: Time | None = None
    exit_code: int | None = None
    signal: int | None = None
    outcome: RunOutcome | None = None
    reason: str | None = None


class Receipt(Strict):
    """What satisfied (or broke) one dependency edge, recorded once."""

    job: str
    uid: str | None = None
    revision: int | None = None
    outcome: str | None = None
    satisfied: bool
    observed_at: Time


class WaitResult(Strict):
    type: str
    satisfied: bool
    last_checked_at: Time | None = None
    message: str | None = None


class JobStatus(Strict):
    phase: Phase = "Waiting"
    outcome: Literal["Succeeded", "Failed", "TimedOut", "Cancelled", "Aborted", "Lost"] | None = None
    reason: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    revision: int = 1
    accepted_at: Time | None = Field(
        default=None, description="When this revision was accepted: waits' delay and the job timeout count from here."
    )
    eligible_at: Time | None = Field(
        default=None, description="When dependencies and waits were satisfied: the queue position."
    )
    bypass_count: int = Field(default=0, description="How often a younger job passed this one in its queue.")
    admission: Admission | None = None
    stop: dict | None = Field(default=None, description="While Stopping: why, when asked, when SIGKILL follows.")
    rerun_token: str | None = Field(default=None, description="The last `rerun` request honoured.")
    node_name: str | None = None
    next_run_at: Time | None = None
    start_time: Time | None = None
    completion_time: Time | None = None
    runs: list[RunRecord] = Field(default_factory=list)
    dependencies: list[Receipt] = Field(default_factory=list)
    waits: list[WaitResult] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


# Phases in which a revision is under way: its spec may change only with `apply --force`.
ACTIVE_PHASES = frozenset({"Starting", "Running", "Stopping", "Backoff"})
# Phases in which a process may be alive: deleting such a job cancels it first.
LIVE_PHASES = frozenset({"Starting", "Running", "Stopping"})
