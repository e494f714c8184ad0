"""The Job kind (API.md 1.1): what to run, when it may start, where, and how to retry it."""

from __future__ import annotations

import os
import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from .meta import API_VERSION, MAX_SLOTS, Int, Name, ObjectMeta, Strict, Time
from .quantity import CPU, Duration, LogLimit, PollInterval, Size, parse_cpu, parse_size, spelled
from .status import DependencyOutcome, JobStatus

DEFAULT_RUN_TIMEOUT = 3600.0  # whole-job timeout of a run job when none is given
DEFAULT_LOG_LIMIT = 64 * 2**20  # bytes of each run log kept when the spec gives no logLimit
# what a job's resources default to, by its type (parsed once: every job validated takes them)
_RUN_CPU, _SERVICE_CPU = parse_cpu(1), parse_cpu(2)
_RUN_MEMORY, _SERVICE_MEMORY = parse_size("512Mi"), parse_size("1Gi")


class Artifact(Strict):
    url: OsString = Field(
        description="file:// or http(s):// address of a zip unpacked into a fresh working dir per run."
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected digest; a mismatch fails the run with reason ArtifactInvalid.",
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str) -> str:
        if not url.startswith(("file://", "http://", "https://")):
            raise ValueError("must start with file://, http:// or https://")
        return url


MAX_PRIORITY = 1_000_000_000  # as Kubernetes bounds a PriorityClass value
MAX_OUTPUT_LIMIT = 64 * 2**10  # probe output is kept in the job's status


def _no_nul(text: str) -> str:
    """Strings that become an argv, a path or a working dir: the OS cannot take a NUL byte."""
    if "\0" in text:
        raise ValueError("must not contain a NUL byte")
    return text


OsString = Annotated[str, AfterValidator(_no_nul)]


def _unset() -> Any:
    """A nested model's default: an empty mapping, which validate_default makes the model
    with its own defaults inside pydantic's core; made by its class, each was a Python call
    into the validator (together about 1 us of a Job's 11 us validation)."""
    return {}


def _succeeded() -> list[DependencyOutcome]:
    return ["Succeeded"]


class Dependency(Strict):
    job: Name = Field(description="Name of the job depended on.")
    outcomes: list[DependencyOutcome] = Field(
        default_factory=_succeeded,
        min_length=1,
        description="Terminal outcomes of that job that satisfy this edge; Finished means any.",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # `- prepare-data` means {job: prepare-data, outcomes: [Succeeded]}
        return {"job": value} if isinstance(value, str) else value

    def satisfied_by(self, outcome: str) -> bool:
        return "Finished" in self.outcomes or outcome in self.outcomes


class Probe(Strict):
    command: list[OsString] = Field(
        min_length=1, description="argv of the probe, run directly (no shell); exit 0 satisfies."
    )
    timeout: Duration = Field(default=spelled("5s"), description="Longest one probe may run.")
    interval: PollInterval = Field(
        default=spelled("2s"), description="Time between evaluations (jittered 90-110%); at least 100ms."
    )
    output_limit: Size = Field(
        default=spelled("4Ki"), le=MAX_OUTPUT_LIMIT, description="Bytes of probe output kept as the diagnostic."
    )
    fatal_on_error: bool = Field(
        default=False, description="A failing probe ends the job Aborted/WaitProbeFailed instead of waiting."
    )


class WaitCondition(Strict):
    """Exactly one of until, delay, path, probe."""

    until: Time | None = Field(default=None, description="Wait until this RFC 3339 time.")
    delay: Duration | None = Field(default=None, description="Wait this long after the job was accepted.")
    path: OsString | None = Field(default=None, description="Wait until this path exists.")
    type: Literal["file", "dir"] | None = Field(default=None, description="With path: require a file or a directory.")
    probe: Probe | None = Field(default=None, description="Wait until this command exits 0.")
    interval: PollInterval | None = Field(
        default=None, description="Poll interval for path (default 1s); at least 100ms."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> WaitCondition:
        given = [k for k in ("until", "delay", "path", "probe") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a wait condition needs exactly one of until, delay, path, probe")
        if self.type is not None and self.path is None:
            raise ValueError("type applies only to a path condition")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("until", "delay", "path", "probe") if getattr(self, k) is not None)


class WaitFor(Strict):
    mode: Literal["all", "any"] = Field(default="all", description="all: every condition; any: one of them.")
    conditions: list[WaitCondition] = Field(default_factory=list)
    abort_at: Time | None = Field(
        default=None, description="Past this time a still-waiting job ends Aborted/WaitAbortDeadline."
    )
    abort_after: Duration | None = Field(default=None, description="Like abortAt, measured from acceptance.")

    @model_validator(mode="after")
    def _one_deadline(self) -> WaitFor:
        if self.abort_at is not None and self.abort_after is not None:
            raise ValueError("give abortAt or abortAfter, not both")
        return self


PlacementStrategy = Literal["spread", "binpack", "round-robin"]
DEFAULT_STRATEGY: PlacementStrategy = "spread"


class Placement(Strict):
    node_name: Name | None = Field(default=None, description="Pin the job to this node.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Only nodes carrying all these labels.")
    # Unset means spread, and is stored unset, as logLimit is: a default written into every
    # stored spec would make an unchanged manifest applied again after the upgrade a new
    # version (and a completed job run again).
    strategy: PlacementStrategy | None = Field(
        default=None,
        description="Which candidate node a run goes to: spread (default: the most free share of its slots), "
        "binpack (the fewest free slots that still fit), round-robin (the next node in name order, by a "
        "store-wide counter that survives restarts).",
    )

    @property
    def chosen_strategy(self) -> PlacementStrategy:
        """strategy, or its default."""
        return DEFAULT_STRATEGY if self.strategy is None else self.strategy


MIN_RESTART_DELAY = 0.1  # seconds: a restart sooner than this would be a hot loop (delay 0 doubles to 0)


class Restart(Strict):
    """A service's restart backoff: `delay` doubles with each run that lived shorter than
    `resetAfter`, up to `maxDelay`; a run that lived `resetAfter` resets it."""

    delay: Duration = Field(default=spelled("1s"), description="Before the restart that follows a healthy run.")
    max_delay: Duration = Field(default=spelled("5m"), description="Cap on the doubling delay.")
    reset_after: Duration = Field(
        default=spelled("10m"),
        description="A run that lived this long resets the delay; shorter ones make the job CrashLoop.",
    )


class ReadinessProbe(Strict):
    command: list[OsString] = Field(
        min_length=1, description="argv of the probe, run directly (no shell); exit 0 means ready."
    )
    timeout: Duration = Field(default=spelled("5s"), description="Longest one probe may run.")
    output_limit: Size = Field(
        default=spelled("4Ki"), le=MAX_OUTPUT_LIMIT, description="Bytes of probe output kept as the diagnostic."
    )


class Readiness(Strict):
    probe: ReadinessProbe
    interval: PollInterval = Field(
        default=spelled("5s"), description="Time between probes of a live run (jittered 90-110%); at least 100ms."
    )

    def as_wait_probe(self) -> WaitCondition:
        """The same probe in the shape the probe runner takes (its values are validated)."""
        probe = Probe.model_construct(
            command=self.probe.command,
            timeout=self.probe.timeout,
            interval=self.interval,
            output_limit=self.probe.output_limit,
            fatal_on_error=False,
        )
        return WaitCondition.model_construct(probe=probe)


DEFAULT_RESTART = Restart()


class Resources(Strict):
    cpu: CPU | None = Field(default=None, description="Defaults: run 1, service 2.")
    memory: Size | None = Field(default=None, description="Defaults: run 512Mi, service 1Gi.")


class Backoff(Strict):
    policy: Literal["constant", "linear", "exponential"] = Field(default="exponential")
    delay: Duration = Field(default=spelled("1s"), description="Base delay before the first retry.")
    factor: float = Field(default=2.0, ge=1.0, le=1000.0, description="Growth factor of exponential backoff.")
    max_delay: Duration = Field(default=spelled("5m"), description="Cap on the delay before jitter.")
    jitter: Duration = Field(
        default=spelled("0s"), description="Full width of the symmetric random spread around the delay."
    )


class Retry(Strict):
    limit: Int = Field(default=0, ge=0, le=1000, description="Retries after the first run; attempts = limit + 1.")
    on_exit_codes: list[Int] = Field(
        default_factory=list, description="Retryable exit codes; empty = every non-zero code."
    )
    on_timeout: bool = Field(default=False, description="Is a run timeout retryable.")
    on_lost: bool = Field(default=True, description="Is a lost run (node or agent gone) retried.")
    lost_after: Duration | None = Field(
        default=None,
        description="A run on a node that stopped posting heartbeats is declared Lost (NodeLost) this long "
        "after the node's last heartbeat; unset: only once its fate is proven (its agent reports, the node "
        "is deleted or drained with --force).",
    )
    backoff: Backoff = Field(default_factory=_unset)

    @field_validator("on_exit_codes")
    @classmethod
    def _codes(cls, codes: list[int]) -> list[int]:
        for code in codes:
            if code == 0:
                raise ValueError("must not contain 0: a zero exit is success, never retried")
            if not 1 <= code <= 255:
                raise ValueError(f"exit code {code} is outside 1..255")
        return sorted(set(codes))


class JobSpec(Strict):
    command: list[OsString] | None = Field(default=None, min_length=1, description="argv, run directly (no shell).")
    shell: OsString | None = Field(
        default=None, min_length=1, description="One string run by /bin/sh -c; exactly one of command/shell."
    )
    working_dir: OsString | None = Field(
        default=None,
        description="Relative paths resolve against the manifest file's folder; "
        "with an artifact, against the run's unpacked folder (and stay relative).",
    )
    env: dict[str, str] = Field(default_factory=dict)
    type: Literal["run", "service"] = Field(
        default="run", description="run: one-shot; service: long-running, restarted."
    )
    port: Int | None = Field(default=None, ge=1, le=65535, description="Service only: where it listens.")
    # Service only. Unset means the defaults, stored unset (see logLimit).
    restart: Restart | None = Field(
        default=None, description="Service only: restart backoff; default delay 1s, maxDelay 5m, resetAfter 10m."
    )
    readiness: Readiness | None = Field(
        default=None, description="Service only: a probe that gates the service's entry in the registry."
    )
    artifact: Artifact | None = None
    depends_on: list[Dependency] = Field(default_factory=list)
    wait_for: WaitFor | None = Field(default=None, description="Gates the first run only.")
    pool: Name | None = Field(default=None, description="Named Pool charged while a run is active.")
    slots: Int = Field(
        default=1, ge=1, le=MAX_SLOTS, description="Slots charged against the pool and the global limit."
    )
    priority: Int = Field(
        default=0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="Higher is admitted first among jobs competing in one scope.",
    )
    placement: Placement = Field(default_factory=_unset)
    resources: Resources = Field(default_factory=_unset)
    retry: Retry = Field(default_factory=_unset)
    timeout: Duration | None = Field(
        default=None,
        description="Whole job from acceptance, time Suspended not counted; default 1h for run, none for service.",
    )
    run_timeout: Duration | None = Field(default=None, description="One run.")
    stop_grace_period: Duration = Field(
        default=spelled("10s"), description="SIGTERM to the process group, then SIGKILL after this."
    )
    # Unset means the default, and is stored unset: a default written into every stored spec
    # would make an unchanged manifest applied again after an upgrade a new version (and a
    # completed job run again).
    log_limit: LogLimit | None = Field(
        default=None,
        description="Bytes of each of a run's stdout and stderr kept on disk, newest kept, oldest dropped "
        "while it runs (looked at about once a second); default 64Mi, at least 4Ki.",
    )
    suspend: bool = Field(default=False, description="Pause: no new run is admitted; an active run is stopped.")

    @property
    def kept_log_bytes(self) -> int:
        """logLimit, or its default."""
        return DEFAULT_LOG_LIMIT if self.log_limit is None else self.log_limit

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"invalid environment variable name {key!r}")
            if "\0" in value:
                raise ValueError(f"the value of {key} contains a NUL byte, which no process environment can hold")
        return env

    @field_validator("port", "restart", "readiness")
    @classmethod
    def _service_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("type", "run") != "service":
            raise ValueError(f"{info.field_name} is only allowed on a service job (type: service)")
        return value

    @property
    def restart_policy(self) -> Restart:
        """restart, or its defaults."""
        return DEFAULT_RESTART if self.restart is None else self.restart

    @field_validator("artifact")
    @classmethod
    def _inside_artifact(cls, artifact: Artifact | None, info: ValidationInfo) -> Artifact | None:
        # an absolute workingDir is refused at apply (manifests.py); a stored one is kept, and
        # the run starts there
        wd = info.data.get("working_dir")
        if artifact is not None and wd and not wd.startswith(("/", "~")):
            inside = posixpath.normpath(wd)
            if inside == ".." or inside.startswith("../"):
                raise ValueError(f"workingDir {wd!r} leaves the unpacked folder, which it is relative to")
        return artifact

    @property
    def host_dir(self) -> str | None:
        """workingDir where it is a folder of the host before any run (a wait probe's):
        with an artifact a relative one lies in the run's unpacked folder, made per run."""
        wd = self.working_dir
        return wd if wd is None or self.artifact is None or os.path.isabs(wd) else None

    @field_validator("pool")
    @classmethod
    def _not_global(cls, pool: str | None) -> str | None:
        if pool == "global":
            raise ValueError("pool: global is the store-wide limit every job is charged against; name another pool")
        return pool

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        # contradictory dependsOn edges are found by api/validation.py, which can name the entry
        if (self.command is None) == (self.shell is None):
            raise ValueError("exactly one of command or shell is required")
        service = self.type == "service"
        if self.resources.cpu is None:
            self.resources.cpu = _SERVICE_CPU if service else _RUN_CPU
        if self.resources.memory is None:
            self.resources.memory = _SERVICE_MEMORY if service else _RUN_MEMORY
        if self.timeout is None and not service:
            self.timeout = DEFAULT_RUN_TIMEOUT
        return self


class Job(Strict):
    api_version: Literal["reconciler.dev/v1alpha1"] = API_VERSION
    kind: Literal["Job"] = "Job"
    metadata: ObjectMeta
    spec: JobSpec
    status: JobStatus | None = None
