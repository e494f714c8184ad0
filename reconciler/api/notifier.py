"""The Notifier kind (API.md 1.3): where job events are delivered, at least once, and the
event document every notifier receives."""

from __future__ import annotations

import functools
import json
from typing import Literal, cast
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from ..errors import InvalidInput
from ..selectors import Requirement, matches, parse
from .job import OsString
from .meta import API_VERSION, ObjectMeta, Strict, Time
from .status import Outcome

# What a notifier may hear of: a job's terminal outcomes, a run starting, a retry scheduled.
STARTED, RETRYING = "Started", "Retrying"
NotifierEvent = Literal["Succeeded", "Failed", "TimedOut", "Cancelled", "Aborted", "Lost", "Started", "Retrying"]
_OUTCOMES = frozenset(o.value for o in Outcome)


def _terminal() -> list[NotifierEvent]:
    return cast(list[NotifierEvent], [o.value for o in Outcome])


class SecretRef(Strict):
    file: OsString = Field(
        description="A file holding the HMAC key (its bytes, one trailing newline dropped), read at each delivery; "
        "a relative path resolves against the manifest's folder."
    )


class NotifierSpec(Strict):
    url: str | None = Field(default=None, description="HTTP POST of a JSON event.")
    command: list[OsString] | None = Field(
        default=None, min_length=1, description="A command (argv, no shell) that gets the event on stdin."
    )
    events: list[NotifierEvent] = Field(
        default_factory=_terminal,
        min_length=1,
        description="What to notify: terminal outcomes (every one by default), Started (a run started), "
        "Retrying (a retry was scheduled).",
    )
    selector: str | None = Field(
        default=None, description="A label selector (as -l takes it): only jobs whose labels match are notified."
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Sign webhook bodies: X-Reconciler-Signature: sha256=<hex HMAC-SHA256 of the body> "
        "with the key in this file.",
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        if url is not None:
            try:
                host = urlsplit(url).hostname
            except ValueError as exc:  # a bad port, an unclosed [
                raise ValueError(f"not a URL: {exc}") from None
            if not host:
                raise ValueError("names no host")
        return url

    @field_validator("selector")
    @classmethod
    def _selector(cls, selector: str | None) -> str | None:
        if selector is not None:
            try:
                requirements(selector)
            except InvalidInput as exc:
                raise ValueError(str(exc)) from None
        return selector

    @model_validator(mode="after")
    def _one_target(self) -> NotifierSpec:
        if (self.url is None) == (self.command is None):
            raise ValueError("exactly one of url or command is required")
        if self.secret_ref is not None and self.url is None:
            raise ValueError("secretRef signs webhook bodies: it needs url")
        return self

    def hears(self, event: str, labels: dict[str, str]) -> bool:
        """Whether this notifier is told of `event` about a job with these labels."""
        return event in self.events and (self.selector is None or matches(requirements(self.selector), labels))


@functools.lru_cache(maxsize=256)
def requirements(selector: str) -> list[Requirement]:
    return parse(selector)


class NotifierStatus(Strict):
    """Read from the outbox when shown, never written into the object."""

    delivered: int = Field(default=0, description="Events delivered.")
    pending: int = Field(default=0, description="Events waiting for delivery or for a retry.")
    failed: int = Field(default=0, description="Events given up: still failing 24h after they happened.")
    last_delivery_time: Time | None = Field(default=None, description="When the last event was delivered.")
    last_error: str | None = Field(default=None, description="Why the last failed attempt failed.")
    last_error_time: Time | None = Field(default=None, description="When it failed.")


class Notifier(Strict):
    api_version: Literal["reconciler.dev/v1alpha1"] = API_VERSION
    kind: Literal["Notifier"] = "Notifier"
    metadata: ObjectMeta
    spec: NotifierSpec
    status: NotifierStatus | None = None


# The seed scheduler's job status words, which its notification consumers read.
_SEED_STATUS = {STARTED: "running", RETRYING: "pending", Outcome.SUCCEEDED: "done"}


def event_body(
    *,
    event: str,
    name: str,
    uid: str,
    reason: str | None,
    run: int | None,
    time: str,
    event_id: str,
) -> str:
    """The exact JSON text every notifier gets for one event (API.md 1.3), signed and sent
    unchanged on every redelivery. `job_id` and `status` are the seed's message
    (`{"job_id", "status": done|failed}`, with names for ids); `outcome` is the job's outcome
    once it completed, null for Started and Retrying."""
    document = {
        "job_id": name,
        "name": name,
        "uid": uid,
        "status": _SEED_STATUS.get(event, "failed"),
        "outcome": event if event in _OUTCOMES else None,
        "reason": reason,
        "run": run,
        "time": time,
        "event_id": event_id,
    }
    return json.dumps(document, separators=(",", ":"))
