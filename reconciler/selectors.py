"""Kubernetes label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidInput

_SET = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in | notin | exists | !exists
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def parse(text: str) -> list[Requirement]:
    requirements = []
    for part in _split(text):
        if m := _SET.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            if not values:
                raise InvalidInput(f"invalid label selector {text!r}: {m.group(2)} needs at least one value")
            requirements.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQ.match(part):
            requirements.append(
                Requirement(m.group(1), "notin" if m.group(2) == "!=" else "in", frozenset([m.group(3)]))
            )
        elif m := _EXISTS.match(part):
            requirements.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise InvalidInput(f"invalid label selector {text!r} near {part.strip()!r}")
    if not requirements:
        raise InvalidInput(f"invalid label selector {text!r}: empty")
    return requirements


def matches(requirements: list[Requirement], labels: dict[str, str]) -> bool:
    return all(r.matches(labels) for r in requirements)
