"""Where a server's answer to an apply points in the files applied: the server names the
request's fields (`items[N].spec.pool`), the user wrote manifests, so a problem is put back
as `file:line: field: message` (the same places apply on a store gives)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..manifests import Manifest

# `items[3].spec.dependsOn[0].job` as the server names a field of the request's third object
_AT = re.compile(r"^items\[(\d+)\]((?:\.[A-Za-z0-9_]+|\[\d+\])*)(?=: |$)")
_FIRST_AT = re.compile(r"\bitems\[(\d+)\]:0\b")  # a duplicate's "(first at items[1]:0)"
_PART = re.compile(r"\.([A-Za-z0-9_]+)|\[(\d+)\]")


def _place(text: str) -> tuple[int, list[str | int]] | None:
    match = _AT.match(text)
    if match is None:
        return None
    return int(match.group(1)), [name or int(index) for name, index in _PART.findall(match.group(2))]


def relocate(text: str, manifests: list[Manifest]) -> str:
    """A server's `items[N].field: message` as `file:line: field: message` of manifest N."""

    def first(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return f"{manifests[index].source}:{manifests[index].line}" if index < len(manifests) else match.group(0)

    text = _FIRST_AT.sub(first, text)
    place = _place(text)
    if place is None or place[0] >= len(manifests):
        return text
    index, path = place
    m = manifests[index]
    where = m.where(*path) if path else f"{m.source}:{m.line}"
    return where + text[_AT.match(text).end() :]  # type: ignore[union-attr]


def about_refused(problem: str, manifests: list[Manifest], refused: set[tuple[str, str]]) -> bool:
    """A server's "does not exist" about an object whose own document was refused here (its
    problems are reported): not reported again, as apply on a store does not."""
    place = _place(problem)
    if place is None or place[0] >= len(manifests):
        return False
    spec = getattr(manifests[place[0]].obj, "spec", None)
    path = place[1]
    if len(path) == 4 and path[:2] == ["spec", "dependsOn"] and path[3] == "job" and isinstance(path[2], int):
        deps = getattr(spec, "depends_on", [])
        return path[2] < len(deps) and ("Job", deps[path[2]].job) in refused
    if path == ["spec", "pool"]:
        return ("Pool", getattr(spec, "pool", None)) in refused
    return False
