"""The Node kind (API.md 1.3): a machine that runs jobs, with capacity and a heartbeat."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field

from .meta import API_VERSION, MAX_SLOTS, Condition, Int, ObjectMeta, Strict, Time, from_epoch, to_epoch
from .quantity import CPU, Size, parse_duration


class Capacity(Strict):
    slots: Int | None = Field(default=None, ge=0, le=MAX_SLOTS, description="Default: the node's CPU count.")
    cpu: CPU | None = Field(
        default=None,
        description="CPUs the runs placed here may hold (their resources.cpu); unset: not counted. "
        "The local node declares the host's count when it registers.",
    )
    memory: Size | None = Field(
        default=None,
        description="Memory the runs placed here may hold (their resources.memory); unset: not counted. "
        "The local node declares the host's memory when it registers.",
    )


class NodeSpec(Strict):
    capacity: Capacity = Field(default_factory=Capacity)
    unschedulable: bool = Field(default=False, description="Cordon: no new runs are placed here.")


class Allocated(Strict):
    slots: int = 0
    cpu: CPU | None = Field(default=None, description="resources.cpu of the runs admitted here, if counted.")
    memory: Size | None = Field(default=None, description="resources.memory of the runs admitted here, if counted.")


class NodeStatus(Strict):
    conditions: list[Condition] = Field(default_factory=list)
    heartbeat_at: Time | None = None
    allocated: Allocated = Field(default_factory=Allocated)
    cpu_count: int | None = Field(default=None, description="CPUs the node's agent reported; the slot default.")
    agent: str | None = Field(default=None, description="Identity of the agent process serving the node.")
    address: str | None = Field(
        default=None, description="Where the node's services are reached; the service registry publishes it."
    )
    remote: bool | None = Field(
        default=None, description="Served by a `reconciler agent` that reports its runs through the API."
    )
    log_port: int | None = Field(default=None, description="Where the node's agent serves its runs' logs.")
    paths_checked_at: Time | None = Field(
        default=None,
        description="When the controller on this node last checked every path that waiting jobs wait for.",
    )
    not_ready_since: Time | None = Field(
        default=None,
        description="Since when the node's heartbeats have stopped, once a controller noticed (event NodeNotReady); "
        "gone with the next heartbeat.",
    )


LOST_AFTER_ENV = "RECONCILER_NODE_LOST_AFTER"


def _ready_window() -> float:
    """Seconds without a heartbeat before a node is NotReady: 40, or RECONCILER_NODE_LOST_AFTER
    (tests shorten it; every process that judges nodes reads the same variable)."""
    text = os.environ.get(LOST_AFTER_ENV, "").strip()
    if not text:
        return 40.0
    try:
        seconds = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
    except ValueError:
        return 40.0
    return seconds if seconds > 0 else 40.0


READY_WINDOW = _ready_window()


def set_ready_window(seconds: float) -> None:
    """`serve --node-lost-after`: this process and those it starts judge nodes by `seconds`."""
    global READY_WINDOW
    READY_WINDOW = seconds
    os.environ[LOST_AFTER_ENV] = f"{seconds:g}s"


def heartbeat_fresh(status: dict[str, Any] | None, now: float) -> bool:
    """A node is Ready while its agent's last heartbeat is younger than READY_WINDOW."""
    beat = (status or {}).get("heartbeatAt")
    return beat is not None and now - to_epoch(beat) < READY_WINDOW


def heartbeat_status(
    previous: dict[str, Any], now: float, *, allocated: dict[str, Any], cpu_count: int, agent: str, address: str
) -> dict[str, Any]:
    """A node's status as a heartbeat at `now` leaves it, local or remote: Ready True since
    the last transition (now, when it had not been Ready or its last heartbeat had gone stale)."""
    stamp = from_epoch(now)
    ready: dict[str, Any] = next((c for c in previous.get("conditions", []) if c.get("type") == "Ready"), {})
    kept = ready.get("status") == "True" and heartbeat_fresh(previous, now)
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "AgentHeartbeat",
        "message": "the node's agent is posting heartbeats",
        "lastTransitionTime": ready.get("lastTransitionTime") if kept else stamp,
    }
    return {
        "conditions": [condition],
        "heartbeatAt": stamp,
        "allocated": allocated,
        "cpuCount": cpu_count,
        "agent": agent,
        "address": address,
    }


def observed_status(status: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """The node's status as it stands at `now`: what its agent last wrote, with the Ready
    condition Unknown once the heartbeat is older than READY_WINDOW (as Kubernetes shows a
    node whose kubelet stopped posting). An agent that is gone cannot write that itself;
    every reader derives it the same way (`get`, `describe`, placement)."""
    observed = dict(status or {})
    if heartbeat_fresh(observed, now) or "conditions" not in observed:
        return observed
    beat = observed.get("heartbeatAt")
    since = from_epoch(to_epoch(beat) + READY_WINDOW) if beat else None
    stale = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": f"the node's agent posted no heartbeat for {READY_WINDOW:g}s (last: {beat or 'never'})",
        "lastTransitionTime": since,
    }
    observed["conditions"] = [stale if c.get("type") == "Ready" else c for c in observed["conditions"]]
    return observed


class Node(Strict):
    api_version: Literal["reconciler.dev/v1alpha1"] = API_VERSION
    kind: Literal["Node"] = "Node"
    metadata: ObjectMeta
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus | None = None
