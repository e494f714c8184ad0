"""All output formatting: tables, -o json|yaml|name, describe, ages. Data goes to stdout."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..api.status import shown_state

if TYPE_CHECKING:
    from ..store import StoredObject


def age(epoch_or_rfc3339: float | str | None, now: float | None = None) -> str:
    """kubectl-style: 45s, 3m12s, 5h, 2d."""
    if epoch_or_rfc3339 is None:
        return "<none>"
    epoch = (
        datetime.fromisoformat(epoch_or_rfc3339.replace("Z", "+00:00")).timestamp()
        if isinstance(epoch_or_rfc3339, str)
        else epoch_or_rfc3339
    )
    seconds = max(0, int((now or time.time()) - epoch))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds % 60 else f"{seconds // 60}m"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def table(headers: list[str], rows: Iterable[list[Any]]) -> str:
    """Plain aligned columns, as kubectl prints them (scripts can cut them)."""
    text_rows = [[("<none>" if v is None or v == "" else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(v)) for w, v in zip(widths, row, strict=True)]
    lines = ["   ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["   ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in text_rows]
    return "\n".join(lines)


def job_state(obj: StoredObject) -> str:
    status = obj.status or {}
    if obj.deleted_at is not None:
        return "Terminating"
    return shown_state(status)


def attempts(status: dict[str, Any]) -> int:
    revision = status.get("revision", 1)
    return sum(1 for r in status.get("runs", []) if r.get("revision") == revision)


def as_list(documents: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": documents}


def dump_json(document: Any) -> str:
    return json.dumps(document, indent=2)


def dump_yaml(document: Any, *, sort_keys: bool = False) -> str:
    import yaml  # not at import: most verbs print no YAML

    return yaml.safe_dump(document, sort_keys=sort_keys, default_flow_style=False)


def output(objects: list[StoredObject], fmt: str, qualified: Callable[[StoredObject], str], single: bool) -> str:
    documents = [o.manifest() for o in objects]
    if fmt == "name":
        return "\n".join(f"{qualified(o)}/{o.name}" for o in objects)
    payload = documents[0] if single and len(documents) == 1 else as_list(documents)
    return dump_json(payload) if fmt == "json" else dump_yaml(payload)
