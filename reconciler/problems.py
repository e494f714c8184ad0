"""A pydantic ValidationError in the words `apply` prints: `file:line: field.path: message`
for a YAML document (the line found by walking its nodes), `field.path: message` for an
object that comes from no file (a request body, a queue message, `run`'s options)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from .yamldoc import format_path


def locate(node: yaml.Node, path: Iterable[str | int]) -> int:
    """Line (1-based) of the deepest node along `path`; parts that are not in the YAML (a
    missing field, a union branch's tag) stop the walk at the nearest enclosing node."""
    return _walk(node, path)[0]


def _walk(node: yaml.Node, path: Iterable[str | int]) -> tuple[int, yaml.Node | None]:
    """(line, node) of the deepest node along `path`; the node is None when the walk stopped
    before the end of the path."""
    line = node.start_mark.line + 1
    reached: yaml.Node | None = node
    for part in path:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            keys = (part, to_camel(part))
            match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value in keys), None)
            if match is None:
                return line, None
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            reached = None
            continue
        reached = node
    return line, reached


_IMPLICIT = {bool: "a boolean", int: "a number", float: "a number", type(None): "null"}


def _not_a_string(error: ErrorDetails, spelled: str | None) -> str | None:
    """A plain scalar YAML resolved to something else where text was wanted (`command:
    [true]`, `env: {DEBUG: yes}`): say so and how to quote it."""
    what = _IMPLICIT.get(type(error.get("input")))
    if error["type"] != "string_type" or what is None:
        return None
    text = spelled if spelled is not None else str(error.get("input"))
    return f'YAML read {text} as {what}, not as text: quote it ("{text}") to mean the string'


def _message(error: ErrorDetails, spelled: str | None = None) -> str:
    if (hint := _not_a_string(error, spelled)) is not None:
        return hint
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "too_short" and isinstance(error.get("input"), str):  # min_length over a validated string
        return (
            f"must have at least {ctx.get('min_length', 1)} character(s)"
            if ctx.get("min_length", 1) > 1
            else "must not be empty"
        )
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        return "must be one of " + expected.replace("'", "").replace(" or ", ", ")
    message: str = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message.replace("Input should be", "must be").replace("Input should have", "must have")


def _clean_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Drop pydantic's union-branch tags (`constrained-int`, `function-after[...]`) from a path."""
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and "-" not in p and p != "str"))


def validation_problems(error: ValidationError, source: str, node: yaml.Node) -> list[str]:
    """A model's validation errors as `file:line: field.path: message`."""

    def place_of(loc: tuple[str | int, ...]) -> tuple[str, str | None]:
        line, reached = _walk(node, loc)
        spelled = reached.value if isinstance(reached, yaml.ScalarNode) else None
        return f"{source}:{line}: {format_path(loc) or '(document)'}", spelled

    return _problems(error, place_of)


def field_problems(error: ValidationError) -> list[str]:
    """The same for an object that comes from no file: `field.path: message`."""
    return _problems(error, lambda loc: (format_path(loc) or "(document)", None))


Place = Callable[[tuple[str | int, ...]], tuple[str, "str | None"]]  # loc -> (where, the scalar as written)


def _problems(error: ValidationError, place_of: Place) -> list[str]:
    by_place: dict[str, list[str]] = {}  # a union's branches fail at one place: say it once
    for item in error.errors():
        place, spelled = place_of(_clean_loc(item["loc"]))
        messages = by_place.setdefault(place, [])
        if (message := _message(item, spelled)) not in messages:
            messages.append(message)
    return [f"{place}: {', or '.join(messages)}" for place, messages in by_place.items()]
