"""Observed state, written only by the system (API.md 1.2). `phase` says what the system is
doing; `outcome` what the job came to, once Completed.

Two views of one document. The pydantic models (`JobStatus`, ...) are its schema: the CRDs,
`explain` and the editor schemas are generated from them. The controller works on the
stored JSON itself, typed by the TypedDicts below (`JobStatusDict`, ...): a step decodes the
stored text and writes it back, and validating it through pydantic on every step would cost
more than the step's SQL. A test holds the two views to the same fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal, TypedDict

from pydantic import Field

from .meta import Condition, Strict, Time


class Phase(StrEnum):
    """What the system is doing with a job."""

    WAITING = "Waiting"
    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    BACKOFF = "Backoff"
    STOPPING = "Stopping"
    SUSPENDED = "Suspended"
    COMPLETED = "Completed"


class Outcome(StrEnum):
    """What a job came to, once Completed."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    CANCELLED = "Cancelled"
    ABORTED = "Aborted"
    LOST = "Lost"


# What a dependency edge may ask of a job: one of its outcomes, or Finished (any of them).
DependencyOutcome = Literal["Succeeded", "Failed", "TimedOut", "Cancelled", "Aborted", "Lost", "Finished"]


class RunOutcome(StrEnum):
    """How one run ended (exit code, signal and reason are recorded apart from it)."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    CANCELLED = "Cancelled"
    START_FAILED = "StartFailed"
    LOST = "Lost"


# Phases in which a revision is under way: its spec may change only with `apply --force`.
ACTIVE_PHASES = frozenset({Phase.STARTING, Phase.RUNNING, Phase.STOPPING, Phase.BACKOFF})
# Phases in which a process may be alive (and slots are held): deleting such a job stops it first.
LIVE_PHASES = frozenset({Phase.STARTING, Phase.RUNNING, Phase.STOPPING})
# Outcomes reported as warnings (events, progress).
WARNING_OUTCOMES = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.ABORTED, Outcome.LOST})


# -- the schema (pydantic) -------------------------------------------------------------------


class Admission(Strict):
    pool: str | None = None
    slots: int
    admitted_at: Time


class FullScope(Strict):
    scope: Literal["global", "pool"]
    name: str
    used: int
    capacity: int
    needed: int


class QueuePlace(Strict):
    """A queued job's place in its line, computed when the job is shown (never stored)."""

    pool: str | None = Field(default=None, description="The job's pool; none: the global line.")
    position: int = Field(description="1 for the first in line, in admission order.")
    length: int = Field(description="How many jobs the line holds.")
    full: FullScope | None = Field(default=None, description="The first finite scope without room for the job.")


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
    limits: str | None = Field(
        default=None,
        description="What holds the run to spec.resources: `cgroup v2`, `cgroup v1`, or `rlimit` (degraded).",
    )
    cgroup: str | None = Field(default=None, description="The run's cgroup, under `reconciler/` in each hierarchy.")
    peak_memory: int | None = Field(default=None, description="Bytes: the most memory the run's cgroup held at once.")
    cpu_seconds: float | None = Field(default=None, description="CPU time the run's processes used (its cgroup's).")


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


class StopRequest(Strict):
    """While Stopping: why, when it was asked, when SIGKILL follows."""

    reason: str
    message: str = ""
    requested_at: Time
    kill_at: float = Field(description="When the grace period ends (seconds since the epoch).")
    killed: bool = Field(default=False, description="SIGKILL was sent.")
    unstarted: int | None = Field(
        default=None,
        description="A run on a remote node not known to have started: its slots wait for its agent's word.",
    )


class JobStatus(Strict):
    phase: Phase = Phase.WAITING
    outcome: Outcome | None = None
    reason: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    spec_hash: str | None = Field(
        default=None, description="The digest of the spec this status describes (suspend left out)."
    )
    revision: int = 1
    accepted_at: Time | None = Field(
        default=None,
        description=(
            "When this revision was accepted: waits' delay and the job timeout (less time Suspended) count from here."
        ),
    )
    eligible_at: Time | None = Field(
        default=None, description="When dependencies and waits were satisfied: the queue position."
    )
    bypass_count: int = Field(default=0, description="How often a younger job passed this one in its queue.")
    admission: Admission | None = None
    stop: StopRequest | None = None
    rerun_token: str | None = Field(default=None, description="The last `rerun` request honoured.")
    propagate: bool = Field(
        default=True, description="Whether this revision makes dependents that consumed an older one run again."
    )
    node_name: str | None = None
    queue: QueuePlace | None = Field(
        default=None, description="Queued: its place in its pool's line, read when shown (never stored)."
    )
    next_run_at: Time | None = Field(default=None, description="During Backoff, or a service's restart delay.")
    suspended_at: Time | None = Field(
        default=None, description="While Suspended: since when. The job timeout does not count suspended time."
    )
    suspended_seconds: float | None = Field(
        default=None, description="Seconds this revision was Suspended before, which its timeout does not count."
    )
    restarts: int | None = Field(
        default=None, description="Service: how often it was restarted (runs dropped from `runs` included)."
    )
    ready: bool | None = Field(
        default=None, description="Service with readiness: whether the live run's last probe passed."
    )
    start_time: Time | None = None
    completion_time: Time | None = None
    runs: list[RunRecord] = Field(default_factory=list)
    dependencies: list[Receipt] = Field(default_factory=list)
    waits: list[WaitResult] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


# -- the stored document, as the controller reads and writes it --------------------------------


class AdmissionDict(TypedDict, total=False):
    pool: str | None
    slots: int
    admittedAt: str


class FullScopeDict(TypedDict):
    scope: str
    name: str
    used: int
    capacity: int
    needed: int


class QueuePlaceDict(TypedDict, total=False):
    pool: str | None
    position: int
    length: int
    full: FullScopeDict


class RunDict(TypedDict, total=False):
    number: int
    revision: int
    node: str | None
    pid: int
    processStartTime: float
    startedAt: str
    finishedAt: str
    exitCode: int | None
    signal: int
    outcome: str
    reason: str
    limits: str
    cgroup: str
    peakMemory: int
    cpuSeconds: float


class ReceiptDict(TypedDict, total=False):
    job: str
    uid: str
    revision: int
    outcome: str | None
    satisfied: bool
    observedAt: str


class WaitDict(TypedDict, total=False):
    type: str
    satisfied: bool
    lastCheckedAt: str
    message: str


class StopDict(TypedDict, total=False):
    reason: str
    message: str
    requestedAt: str
    killAt: float
    killed: bool
    unstarted: int


class ConditionDict(TypedDict, total=False):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None
    message: str | None
    lastTransitionTime: str


class JobStatusDict(TypedDict, total=False):
    phase: str
    outcome: str | None
    reason: str | None
    message: str | None
    observedGeneration: int
    specHash: str
    revision: int
    acceptedAt: str
    eligibleAt: str
    bypassCount: int
    admission: AdmissionDict
    stop: StopDict
    rerunToken: str | None
    propagate: bool
    nodeName: str
    queue: QueuePlaceDict
    nextRunAt: str
    suspendedAt: str
    suspendedSeconds: float
    restarts: int
    ready: bool
    startTime: str
    completionTime: str
    runs: list[RunDict]
    dependencies: list[ReceiptDict]
    waits: list[WaitDict]
    conditions: list[ConditionDict]


# What a revision's progress consists of: cleared when a new revision starts.
_REVISION_FIELDS = (
    "eligibleAt",
    "startTime",
    "completionTime",
    "nextRunAt",
    "suspendedSeconds",
    "admission",
    "nodeName",
    "stop",
    "restarts",
    "ready",
)
_REVISION_CONDITIONS = frozenset({"Completed", "Succeeded"})


# a suspended job's reason and message (its event's too), said by whoever stores it so
SUSPENDED_REASON = "Suspended"
SUSPENDED_MESSAGE = "suspended: no new run is admitted"


def new_job_status(accepted_at: str, depends_on: Sequence[str] = (), *, suspended: bool = False) -> JobStatusDict:
    """The status of a job just stored: Waiting at revision 1, stored as the controller's
    first look would leave it, so that look writes nothing (a write a job, on a DAG or a
    burst of jobs from a queue; tests hold the two equal). A job with dependencies waits for
    each, in order, with no receipt yet (controller/job.py `waiting`); a suspended one is
    Suspended (its creator records the event the look would have: `first_events`), whatever
    it depends on."""
    status: JobStatusDict = {"phase": Phase.WAITING, "revision": 1, "acceptedAt": accepted_at}
    if depends_on:
        status["dependencies"], status["waits"] = [], []
        status["reason"], status["message"] = waiting_for(depends_on)
    if suspended:
        status["phase"], status["reason"], status["message"] = Phase.SUSPENDED, SUSPENDED_REASON, SUSPENDED_MESSAGE
        status["outcome"] = None
        status["suspendedAt"] = accepted_at  # the timeout's clock starts at the resume
    return status


def first_events(status: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The events (reason, message) the controller's first look would have recorded for a
    status that new_job_status gave: its creator records them after Created."""
    if (status or {}).get("phase") == Phase.SUSPENDED:
        return [(SUSPENDED_REASON, SUSPENDED_MESSAGE)]
    return []


def settled_when_stored(status: Mapping[str, Any] | None) -> bool:
    """Whether a status that new_job_status gave is one the controller's first look leaves
    as it is and sets no timer for: Suspended, until a resume (a write the loop hears of).
    A Waiting job's look admits it, or learns what it waits on."""
    return (status or {}).get("phase") == Phase.SUSPENDED


def waiting_for(pending: Sequence[str]) -> tuple[str, str]:
    """The reason and message of a job waiting for these dependencies, in their order."""
    return "WaitingForDependencies", "waiting for " + ", ".join(pending)


def next_revision(status: JobStatusDict, accepted_at: str) -> None:
    """Start revision N+1 in place: the runs, receipts of old revisions and queue position go;
    the run records and the conditions that do not describe a completion stay."""
    status["revision"] = status.get("revision", 1) + 1
    status["acceptedAt"] = accepted_at
    for key in _REVISION_FIELDS:
        status.pop(key, None)  # type: ignore[misc]  # each is an optional key
    if "suspendedAt" in status:  # suspended still: the new revision's clock is stopped from its start
        status["suspendedAt"] = accepted_at
    status["dependencies"] = []
    status["waits"] = []
    status["bypassCount"] = 0
    status["conditions"] = [c for c in status.get("conditions", []) if c.get("type") not in _REVISION_CONDITIONS]


def shown_state(status: JobStatusDict | dict[str, Any] | None) -> str:
    """What `get` shows of a job (API.md 1.2): its outcome once Completed, its phase before."""
    phase = phase_of(status)
    if phase == Phase.COMPLETED:
        return str((status or {}).get("outcome") or phase)
    return str(phase)


def phase_of(status: JobStatusDict | dict[str, Any] | None) -> Phase:
    """The phase of a stored status (a job never reconciled yet is Waiting). By a table:
    calling the enum costs more than a step's other reads of its status (seven a step)."""
    value = (status or {}).get("phase") or Phase.WAITING
    found = _PHASES.get(value)
    return found if found is not None else Phase(value)  # not a phase: Phase's own ValueError


_PHASES: dict[str, Phase] = {phase.value: phase for phase in Phase}


def shown_job_status(status: dict[str, Any]) -> dict[str, Any]:
    """A job's status as API.md 1.2 spells it: `outcome` and `reason` always there (null until
    set), and each run's `finishedAt`, `exitCode`, `signal`, `outcome` and `reason`; stored
    without them while unset."""
    shown = {"outcome": None, "reason": None, **status}
    if runs := status.get("runs"):
        unset = {"finishedAt": None, "exitCode": None, "signal": None, "outcome": None, "reason": None}
        shown["runs"] = [{**unset, **run} for run in runs]
    return shown
