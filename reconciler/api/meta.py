"""What every resource shares: the strict base model, names, labels and object metadata."""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, StrictInt
from pydantic.alias_generators import to_camel

API_VERSION: Final = "reconciler.dev/v1alpha1"
GROUP: Final = "reconciler.dev"

MAX_SLOTS = 1_000_000  # slots of one job, pool or node: far past any machine, far below any integer limit
MAX_BYPASS = 1_000_000

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class Strict(BaseModel):
    """Every API model: camelCase on the wire, unknown fields refused at any depth."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, validate_default=True)


# A manifest's integer: `slots: "2"` is refused as Kubernetes refuses it, not read as 2 (a
# string where a number belongs is a mistake the user should hear of)
Int = StrictInt


def check_name(value: str) -> str:
    """DNS-1123 label; names become file paths later, so this is also a security check."""
    if len(value) > 63 or not _NAME.fullmatch(value):
        raise ValueError(
            f"invalid name {value!r}: must be a DNS-1123 label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return value


Name = Annotated[str, AfterValidator(check_name)]


@functools.lru_cache(maxsize=4096)  # label keys and values repeat across objects; errors are not cached
def check_label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"invalid label key {key!r}: the prefix must be a DNS subdomain")
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        raise ValueError(f"invalid label key {key!r}: at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends")
    return key


@functools.lru_cache(maxsize=4096)
def check_label_value(value: str) -> str:
    if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
        raise ValueError(f"invalid label value {value!r}: at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends")
    return value


def utcnow() -> datetime:
    return datetime.now(UTC)


def format_time(value: datetime) -> str:
    """RFC 3339 UTC with milliseconds, as API.md asks of machine output."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@functools.lru_cache(maxsize=4096)
def to_epoch(text: str) -> float:
    """Seconds since the epoch from an RFC 3339 time as written in status (each step of a job
    reads its runs' times again: the same few texts)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def from_epoch(epoch: float) -> str:
    """`format_time(datetime.fromtimestamp(epoch, UTC))`, the same text, without the datetime:
    every step stamps its changes with it. The microseconds round half to even, as
    fromtimestamp rounds them, and the milliseconds are cut from them, as isoformat cuts."""
    if not 0 <= epoch < _YEAR_10000:  # before 1970, or past what RFC 3339 spells: as datetime does
        return format_time(datetime.fromtimestamp(epoch, UTC))
    second = int(epoch)
    micros = round((epoch - second) * 1e6)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    return f"{_second_text(second)}.{micros // 1000:03d}Z"


_YEAR_10000 = 253_402_300_800  # 10000-01-01T00:00:00Z


@functools.lru_cache(maxsize=256)
def _second_text(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("must carry a time zone, e.g. 2026-12-01T03:00:00Z")
    return value.astimezone(UTC)


Time = Annotated[datetime, AfterValidator(_aware), PlainSerializer(format_time, return_type=str)]


def _resource_version(value: str) -> str:
    if not value.isdecimal():
        raise ValueError(f"invalid resourceVersion {value!r}: use one the system wrote (get -o yaml shows it)")
    return value


# checked key by key, so that every bad label is named by its own path (metadata.labels.KEY)
LabelKey = Annotated[str, AfterValidator(check_label_key)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]


class ObjectMeta(Strict):
    name: Name = Field(description="DNS-1123 label naming the object; unique per kind.")
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, description="Key/value pairs for selectors (-l).")
    annotations: dict[str, str] = Field(default_factory=dict, description="Free-form notes, not used for selection.")
    uid: str | None = Field(default=None, description="Set by the system.")
    generation: int | None = Field(default=None, description="Set by the system; bumped on every spec change.")
    resource_version: Annotated[str, AfterValidator(_resource_version)] | None = Field(
        default=None,
        description="Set by the system. When a manifest carries one, apply succeeds only if it is still current.",
    )
    creation_timestamp: Time | None = Field(default=None, description="Set by the system.")
    deletion_timestamp: Time | None = Field(default=None, description="Set by the system.")


class Condition(Strict):
    """A Kubernetes condition."""

    type: str
    status: str = Field(description='"True", "False" or "Unknown".')
    reason: str | None = None
    message: str | None = None
    last_transition_time: Time | None = None


def dump(model: BaseModel) -> dict[str, Any]:
    """The wire form: camelCase, JSON types, defaults included (they are part of the spec)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
