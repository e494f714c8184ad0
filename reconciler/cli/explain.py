"""`reconciler explain KIND[.FIELD...]`: field documentation, printed like `kubectl explain`.

It walks the same structural schema that is written into crds/ (reconciler.api.schema), so
the docs a user reads here and the CRDs a cluster gets cannot disagree."""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

import typer

WIDTH = 80


def type_name(node: dict[str, Any]) -> str:
    """kubectl's spelling: <string>, <[]Object>, <map[string]string>, <IntOrString>."""
    if node.get("x-kubernetes-int-or-string"):
        return "IntOrString"
    kind = node.get("type")
    if kind == "array":
        return "[]" + type_name(node.get("items", {}))
    if kind == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and "properties" not in node:
            return f"map[string]{type_name(extra)}"
        return "Object"
    return kind or "Object"


def _element(node: dict[str, Any]) -> dict[str, Any]:
    """Fields of a list are the fields of its items, as in kubectl."""
    while node.get("type") == "array" and "items" in node:
        node = node["items"]
    return node


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - len(indent), break_long_words=False, break_on_hyphens=False) or [""]


def _literal(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def resolve(path: str) -> tuple[Any, list[str], dict[str, Any]]:
    """(KindInfo, field names, schema node) of `job.spec.retry`; InvalidInput when unknown."""
    from ..api.kinds import resolve_kind
    from ..api.schema import structural_schema
    from ..errors import InvalidInput

    word, *fields = path.split(".")
    info = resolve_kind(word)
    node = structural_schema(info)
    for i, field in enumerate(fields):
        parent = ".".join([word, *fields[:i]])
        props = _element(node).get("properties", {})
        if field not in props:
            known = ", ".join(sorted(props)) or "none: it has no fields"
            raise InvalidInput(f'{path}: field "{field}" does not exist in {parent} (known fields: {known})')
        node = props[field]
    return info, fields, node


def _field_lines(name: str, node: dict[str, Any], required: bool, depth: int, recursive: bool) -> list[str]:
    pad = "  " * depth
    lines = [f"{pad}{name}\t<{type_name(node)}>" + (" -required-" if required else "")]
    if recursive:
        return lines + _fields(node, depth + 1, recursive)
    if "enum" in node or "enum" in _element(node):
        lines.append(f"{pad}enum: " + ", ".join(_literal(v) for v in node.get("enum") or _element(node)["enum"]))
    if "default" in node:
        lines.append(f"{pad}default: {_literal(node['default'])}")
    lines += [f"{pad}  {line}" for line in _wrap(node.get("description", "<no description>"), pad + "  ")]
    return [*lines, ""]


def _fields(node: dict[str, Any], depth: int, recursive: bool) -> list[str]:
    element = _element(node)
    required = set(element.get("required", []))
    lines: list[str] = []
    for name in sorted(element.get("properties", {})):
        lines += _field_lines(name, element["properties"][name], name in required, depth, recursive)
    return lines


def explain_text(path: str, recursive: bool = False) -> str:
    from ..api.meta import GROUP
    from ..api.schema import VERSION

    info, fields, node = resolve(path)
    out = [f"GROUP:      {GROUP}", f"KIND:       {info.kind}", f"VERSION:    {VERSION}", ""]
    if fields:
        out += [f"FIELD: {fields[-1]} <{type_name(node)}>", ""]
    enum = _element(node).get("enum")
    if enum:
        out += ["ENUM:", *(f"    {_literal(v)}" for v in enum), ""]
    if "default" in node:
        out += ["DEFAULT:", f"    {_literal(node['default'])}", ""]
    out += ["DESCRIPTION:", *(f"    {line}" for line in _wrap(node.get("description", "<empty>"), "    ")), ""]
    children = _fields(node, 1, recursive)
    if children:
        out += ["FIELDS:", *children]
    return "\n".join(out).rstrip("\n") + "\n"


def register(app: typer.Typer) -> None:
    @app.command(help="Documentation of a kind or field from the schema, e.g. `explain job.spec.retry`.")
    def explain(
        path: str = typer.Argument(..., metavar="KIND[.FIELD...]", help="e.g. jobs, pool.spec, job.spec.retry.backoff"),
        recursive: bool = typer.Option(False, "--recursive", help="List every nested field, names and types only."),
    ) -> None:
        sys.stdout.write(explain_text(path, recursive))
