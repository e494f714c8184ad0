"""Placement over nodes (API.md section 2, Placement). Pure: candidates are Ready,
schedulable nodes matching nodeName/nodeSelector with room; a strategy picks one.

Room is slots and, on a node that declares them (`capacity.cpu`, `capacity.memory`), the
job's `resources` against what the node's admissions hold: a node with cpu 2 takes two
1-CPU jobs at once, not three."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

STRATEGIES = ("spread", "binpack", "round-robin")


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    unschedulable: bool
    capacity: int
    allocated: int
    labels: dict[str, str] = field(default_factory=dict)
    ports: frozenset[int] = frozenset()  # held by services admitted there, or found in use
    cpu: float | None = None  # declared capacity; None: not counted here
    memory: int | None = None
    cpu_allocated: float = 0.0
    memory_allocated: int = 0

    @property
    def free(self) -> int:
        return self.capacity - self.allocated

    def short_of(self, cpu: float, memory: int) -> str | None:
        """Which declared resource cannot take the job now."""
        # a float sum of quantities like 0.1 is not exact: a thousandth of a CPU is the unit
        if self.cpu is not None and round((self.cpu - self.cpu_allocated - cpu) * 1000) < 0:
            return "insufficient cpu"
        if self.memory is not None and self.memory - self.memory_allocated < memory:
            return "insufficient memory"
        return None


@dataclass(frozen=True)
class Placement:
    node: str | None
    message: str = ""


def _why_not(
    node: NodeView,
    node_name: str | None,
    selector: dict[str, str],
    slots: int,
    port: int | None,
    cpu: float = 0.0,
    memory: int = 0,
) -> str | None:
    if node_name is not None and node.name != node_name:
        return "didn't match nodeName"
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return "didn't match nodeSelector"
    if not node.ready:
        return "not ready"
    if node.unschedulable:
        return "unschedulable (cordoned)"
    if node.free < slots:
        return "insufficient slots"
    if (short := node.short_of(cpu, memory)) is not None:
        return short
    if port is not None and port in node.ports:
        return f"port {port} taken"
    return None


def place(
    nodes: list[NodeView],
    *,
    slots: int,
    node_name: str | None,
    selector: dict[str, str],
    strategy: str = "spread",
    turn: int = 0,
    port: int | None = None,
    cpu: float = 0.0,
    memory: int = 0,
) -> Placement:
    """`turn` is the store-wide round-robin counter; `port` a service's, which must be free;
    `cpu` and `memory` the job's resources, counted on nodes that declare them."""
    reasons: Counter[str] = Counter()
    candidates = []
    for node in sorted(nodes, key=lambda n: n.name):
        why = _why_not(node, node_name, selector, slots, port, cpu, memory)
        if why is None:
            candidates.append(node)
        else:
            reasons[why] += 1
    if not candidates:
        detail = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
        return Placement(None, f"0/{len(nodes)} nodes are available" + (f": {detail}" if detail else ""))
    if strategy == "binpack":
        chosen = min(candidates, key=lambda n: (n.free, n.name))
    elif strategy == "round-robin":
        chosen = candidates[turn % len(candidates)]
    else:  # spread: the most free share of capacity
        chosen = min(candidates, key=lambda n: (-(n.free / n.capacity if n.capacity else 0), -n.free, n.name))
    return Placement(chosen.name, f"placed on {chosen.name} ({strategy})")
