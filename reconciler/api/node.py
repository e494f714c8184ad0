"""The Node kind (API.md 1.3): a machine that runs jobs, with capacity and a heartbeat."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .meta import API_VERSION, MAX_SLOTS, Condition, ObjectMeta, Strict, Time, to_epoch
from .quantity import CPU, Size


class Capacity(Strict):
    slots: int | None = Field(default=None, ge=0, le=MAX_SLOTS, description="Default: the node's CPU count.")
    cpu: CPU | None = None
    memory: Size | None = None


class NodeSpec(Strict):
    capacity: Capacity = Field(default_factory=Capacity)
    unschedulable: bool = Field(default=False, description="Cordon: no new runs are placed here.")


class Allocated(Strict):
    slots: int = 0


class NodeStatus(Strict):
    conditions: list[Condition] = Field(default_factory=list)
    heartbeat_at: Time | None = None
    allocated: Allocated = Field(default_factory=Allocated)
    cpu_count: int | None = Field(default=None, description="CPUs the node's agent reported; the slot default.")
    agent: str | None = Field(default=None, description="Identity of the agent process serving the node.")


READY_WINDOW = 40.0  # seconds without a heartbeat before a node is NotReady


def heartbeat_fresh(status: dict[str, Any] | None, now: float) -> bool:
    """A node is Ready while its agent's last heartbeat is younger than READY_WINDOW."""
    beat = (status or {}).get("heartbeatAt")
    return beat is not None and now - to_epoch(beat) < READY_WINDOW


class Node(Strict):
    api_version: Literal["reconciler.dev/v1alpha1"] = API_VERSION
    kind: Literal["Node"] = "Node"
    metadata: ObjectMeta
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus | None = None
