"""The Source kind (API.md 1.3): a queue that jobs arrive from (the seed's SQS ingestion),
over AMQP (RabbitMQ) or the seed's HTTP queue protocol, with a template of defaults merged
under every job it creates."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .job import JobSpec
from .meta import API_VERSION, ObjectMeta, Strict, Time, check_label_key, check_label_value

# what a template may hold besides job spec fields: metadata every created job gets
TEMPLATE_METADATA = ("labels", "annotations")
# the message gives the command; a default one would make a job of any message
TEMPLATE_REFUSED = ("command", "shell")

# up to the last @ before the path: a password may hold an @ of its own
# (`amqp://guest:top@secret@host/`), or a ? or # a user did not escape; an @ in a query with
# no path before it (`http://host?mail=a@b`) is masked too: more hidden, never less
_USERINFO = re.compile(r"//[^/\s]*@")


def shown_url(url: str) -> str:
    """A URL (or a text holding URLs) as status, events and logs show it: no password in it."""
    return _USERINFO.sub("//***@", url)


class AmqpQueue(Strict):
    url: str = Field(description="The broker, e.g. amqp://guest:guest@127.0.0.1:5672/ (amqps:// for TLS).")
    queue: str = Field(min_length=1, max_length=255, description="The queue to consume; it must exist.")

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str) -> str:
        if not url.startswith(("amqp://", "amqps://")):
            raise ValueError("must start with amqp:// or amqps://")
        return url


class HttpQueue(Strict):
    url: str = Field(
        description="The queue server: GET {url}/queues/{queue}/messages, DELETE {url}/queues/{queue}/messages/{id}."
    )
    queue: str = Field(
        min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._~-]+$", description="The queue's name in the URL path."
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url.rstrip("/")


class SourceSpec(Strict):
    amqp: AmqpQueue | None = Field(default=None, description="Consume an AMQP 0-9-1 queue (RabbitMQ).")
    http: HttpQueue | None = Field(default=None, description="Poll a queue over the seed's HTTP protocol.")
    template: dict[str, Any] = Field(
        default_factory=dict,
        description="Defaults under every job the source creates: labels, annotations and any Job spec field "
        "(pool, retry, timeout, ...); what the message says wins.",
    )

    @model_validator(mode="after")
    def _one_queue(self) -> SourceSpec:
        if (self.amqp is None) == (self.http is None):
            raise ValueError("exactly one of amqp or http is required")
        return self

    @field_validator("template")
    @classmethod
    def _template(cls, template: dict[str, Any]) -> dict[str, Any]:
        for field in TEMPLATE_REFUSED:
            if field in template:
                raise ValueError(f"{field}: the message gives the command; a template may not")
        for field in TEMPLATE_METADATA:
            values = template.get(field, {})
            if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
                raise ValueError(f"{field}: must be a map of strings")
            if field == "labels":
                for key, value in values.items():
                    check_label_key(key)
                    check_label_value(value)
        # the job fields, checked as a job's: a ValidationError here names spec.template.FIELD
        _template_job(template)
        return template

    def job_template(self) -> JobSpec:
        """The template's job fields as a job's spec (a placeholder command): what it names."""
        return _template_job(self.template)


def _template_job(template: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate({**job_defaults(template), "command": ["true"]})


def job_defaults(template: dict[str, Any]) -> dict[str, Any]:
    """The Job spec fields of a template (its labels and annotations left out)."""
    return {k: v for k, v in template.items() if k not in TEMPLATE_METADATA}


class SourceStatus(Strict):
    """Written by the controller, in the transaction of what it counts: durable."""

    connected: bool = Field(default=False, description="Whether the controller is consuming the queue now.")
    received: int = Field(default=0, description="Messages received (a redelivery counts again).")
    created: int = Field(default=0, description="Jobs created from messages.")
    duplicates: int = Field(default=0, description="Redelivered messages whose job already existed: acknowledged.")
    rejected: int = Field(default=0, description="Messages that were not a valid job: rejected, each with an event.")
    last_message_time: Time | None = Field(default=None, description="When the last message was received.")
    last_error: str | None = Field(default=None, description="The last connection or message error.")
    last_error_time: Time | None = Field(default=None, description="When it happened.")


class Source(Strict):
    api_version: Literal["reconciler.dev/v1alpha1"] = API_VERSION
    kind: Literal["Source"] = "Source"
    metadata: ObjectMeta
    spec: SourceSpec
    status: SourceStatus | None = None
