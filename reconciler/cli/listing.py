"""`get`: one listing for every kind, plus `-w` printing changes as they happen."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from .columns import COLUMNS
from .render import age, dump_json, dump_yaml, table
from .render import output as render_output

if TYPE_CHECKING:
    from ..selectors import Requirement
    from ..store import Store

EVENT_HEADERS = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]


def _events(store: Store, names: list[str], fmt: str | None) -> str:
    from ..api.meta import from_epoch
    from ..reads import events

    rows = events(store, names)
    if fmt in ("json", "yaml"):
        items = [
            {
                "type": r.type,
                "reason": r.reason,
                "message": r.message,
                "involvedObject": {"kind": r.kind, "name": r.name, "uid": r.uid},
                "lastTimestamp": from_epoch(r.time),
                "resourceVersion": str(r.resource_version),
            }
            for r in rows
        ]
        payload = {"apiVersion": "v1", "kind": "List", "items": items}
        return dump_json(payload) if fmt == "json" else dump_yaml(payload)
    return table(
        EVENT_HEADERS, ([age(r.time), r.type, r.reason, f"{r.kind.lower()}/{r.name}", r.message] for r in rows)
    )


def print_listing(
    store: Store, kind: str, names: list[str], selector: list[Requirement] | None, fmt: str | None
) -> None:
    from ..api.kinds import KINDS
    from ..reads import EVENTS, objects

    if kind.lower() in EVENTS:
        typer.echo(_events(store, names, fmt))
        return
    listing = objects(store, kind, names, selector)
    if fmt in ("json", "yaml", "name"):
        text = render_output(
            listing.objects, fmt, lambda o: KINDS[o.kind].qualified, single=bool(names) and len(names) == 1
        )
        if text:
            typer.echo(text)
        return
    if not listing.objects:
        typer.echo("No resources found.", err=True)
        return
    headers, wide_headers, row = COLUMNS[listing.kind]
    wide = fmt == "wide"
    typer.echo(table(headers + (wide_headers if wide else []), (row(o, wide) for o in listing.objects)))


def watch_listing(
    store: Store, kind: str, names: list[str], selector: list[Requirement] | None, fmt: str | None
) -> None:
    """Print each object again whenever it changes (Ctrl-C ends)."""
    from ..reads import EVENTS, objects, watch

    if kind.lower() in EVENTS:
        return
    label = objects(store, kind, names, selector).kind
    headers, _, row = COLUMNS[label]
    try:
        for o in watch(store, kind, names, selector):
            typer.echo(table(headers, [row(o, fmt == "wide")]).splitlines()[1])
    except KeyboardInterrupt:
        return
