"""The Notifier kind (API.md 1.3): where terminal job events are delivered, at least once."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .meta import API_VERSION, ObjectMeta, Strict
from .status import Outcome


class NotifierSpec(Strict):
    url: str | None = Field(default=None, description="HTTP POST of a JSON event.")
    command: list[str] | None = Field(default=None, min_length=1, description="A command that gets the event on stdin.")
    events: list[Outcome] = Field(
        default_factory=lambda: list(Outcome),
        min_length=1,
        description="Outcomes to notify; every terminal outcome by default.",
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url

    @model_validator(mode="after")
    def _one_target(self) -> NotifierSpec:
        if (self.url is None) == (self.command is None):
            raise ValueError("exactly one of url or command is required")
        return self


class Notifier(Strict):
    api_version: Literal["reconciler.dev/v1alpha1"] = API_VERSION
    kind: Literal["Notifier"] = "Notifier"
    metadata: ObjectMeta
    spec: NotifierSpec
    status: dict[str, Any] | None = None
