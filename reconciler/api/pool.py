"""The Pool kind (API.md 1.3): a named slot limit. The pool named `global` is the store-wide limit."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from .meta import API_VERSION, MAX_BYPASS, MAX_SLOTS, Int, ObjectMeta, Strict

GLOBAL_POOL = "global"


def _check_slots(value: object) -> object:
    if value == "unlimited" or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SLOTS):
        return value
    raise ValueError(f'must be a non-negative integer, at most {MAX_SLOTS}, or "unlimited"')


class PoolSpec(Strict):
    slots: Annotated[int | Literal["unlimited"], BeforeValidator(_check_slots)] = Field(
        default="unlimited", description='Slot limit, a non-negative integer or "unlimited".'
    )
    max_bypass: Int = Field(
        default=3,
        ge=0,
        le=MAX_BYPASS,
        description="How often a younger job may pass the oldest waiting one that does not fit.",
    )

    @property
    def capacity(self) -> int | None:
        """None when unlimited."""
        return None if self.slots == "unlimited" else self.slots


class PoolStatus(Strict):
    used: int = Field(default=0, description="Slots held by active admissions.")
    queued: int = Field(default=0, description="Jobs waiting for admission in this pool.")


class Pool(Strict):
    api_version: Literal["reconciler.dev/v1alpha1"] = API_VERSION
    kind: Literal["Pool"] = "Pool"
    metadata: ObjectMeta
    spec: PoolSpec = Field(default_factory=PoolSpec)
    status: PoolStatus | None = None
