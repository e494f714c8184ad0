"""`get`: one listing for every kind, plus `-w` printing changes as they happen."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import typer

from ..errors import InvalidInput, NotFound
from .columns import COLUMNS
from .render import age, as_list, dump_json, dump_yaml, table
from .render import output as render_output

if TYPE_CHECKING:
    from ..client import Client
    from ..reads import Listing

EVENT_HEADERS = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]


def _event_items(rows: list[Any]) -> list[dict[str, Any]]:
    from ..wire import event_doc

    return [event_doc(r) for r in rows]


def _event_names(rows: list[Any]) -> list[str]:
    """As kubectl prints an event's name: `event/NAME` (NAME.HEX, wire.event_doc's)."""
    return [f"event/{d['metadata']['name']}" for d in _event_items(rows)]


def _event_table(rows: list[Any]) -> str:
    return table(
        EVENT_HEADERS, ([age(r.time), r.type, r.reason, f"{r.kind.lower()}/{r.name}", r.message] for r in rows)
    )


def _structured(items: list[dict[str, Any]], fmt: str) -> str:
    payload = as_list(items)
    return dump_json(payload) if fmt == "json" else dump_yaml(payload)


def targets(kind: str, names: list[str]) -> list[tuple[str, list[str]]]:
    """What `get` was asked for, as (kind, names) in the order given, each kind once (plural:
    `jobs`, `services`, `events`). As kubectl: `jobs,pools NAME...` looks every name up in
    each kind; `job/a pool/b` names each object with its kind, and then every argument must."""
    words = [kind, *names]
    if any("/" in w for w in words):
        pairs = [w.partition("/") for w in words]
        if not all(sep and k and n for k, sep, n in pairs):
            raise InvalidInput(
                "get: give KIND NAME... or KIND/NAME..., not both (e.g. get jobs a b, or get job/a pool/b)"
            )
        grouped: dict[str, list[str]] = {}
        for k, _, n in pairs:
            grouped.setdefault(_plural(k), []).append(n)
        return list(grouped.items())
    kinds = [w for w in kind.split(",") if w]
    if not kinds:
        raise InvalidInput(f"get {kind!r}: name a kind, e.g. jobs or jobs,pools")
    return [(k, list(names)) for k in dict.fromkeys(_plural(w) for w in kinds)]


def _label(kind: str) -> str:
    from ..api.kinds import resolve_kind

    return resolve_kind(kind).kind


def _plural(word: str) -> str:
    """One spelling per kind, so `job,jobs` is one kind; an unknown word is refused here, before
    anything is printed."""
    from ..api.kinds import resolve_kind
    from ..reads import EVENTS, SERVICES

    if word.lower() in EVENTS:
        return "events"
    if word.lower() in SERVICES:
        return "services"
    return resolve_kind(word, also=("services", "events")).plural


def print_listing(client: Client, kind: str, names: list[str], selector: str | None, fmt: str | None) -> None:
    """One kind: what exists, then each missing name as an error (exit 3), as kubectl; several
    kinds through print_kinds."""
    from ..reads import EVENTS

    if kind in EVENTS:
        _print_events(client.events(names), fmt)
    else:
        _print_objects(client.objects(kind, names, selector, strict=False), names, fmt)


def _print_events(rows: list[Any], fmt: str | None) -> None:
    if fmt in ("json", "yaml"):
        typer.echo(_structured(_event_items(rows), fmt))
    elif fmt == "name":
        if found := _event_names(rows):
            typer.echo("\n".join(found))
    else:
        typer.echo(_event_table(rows))


def _print_objects(listing: Listing, names: list[str], fmt: str | None) -> None:
    """As kubectl: what exists is printed, then each name that does not is an error (exit 3)."""
    from ..api.kinds import qualified as kind_name
    from ..reads import not_found

    if fmt in ("json", "yaml", "name"):
        if listing.objects or not listing.missing:  # only names that are missing: only the errors
            single = bool(names) and len(names) == 1
            text = render_output(listing.objects, fmt, lambda o: kind_name(o.kind), single=single)
            if text:
                typer.echo(text)
    elif listing.objects:
        typer.echo(_object_table(listing, fmt == "wide", qualified=False))
    elif not listing.missing:
        typer.echo("No resources found.", err=True)
    if listing.missing:
        for name in listing.missing:
            typer.echo(f"error: {not_found(listing.kind, name)}", err=True)
        raise typer.Exit(3)


def _object_table(listing: Listing, wide: bool, *, qualified: bool) -> str:
    """A kind's table; with `qualified` (several kinds shown) each NAME is `kind.group/name`,
    as kubectl prints it then."""
    from ..api.kinds import qualified as kind_name

    headers, wide_headers, row = COLUMNS[listing.kind]
    rows = (row(o, wide) for o in listing.objects)
    if qualified:
        rows = ([f"{kind_name(o.kind)}/{r[0]}", *r[1:]] for o, r in zip(listing.objects, rows, strict=True))
    return table(headers + (wide_headers if wide else []), rows)


def print_kinds(client: Client, wanted: list[tuple[str, list[str]]], selector: str | None, fmt: str | None) -> None:
    """Several kinds, as kubectl prints them: each kind's table in turn, a blank line between
    them; one List for json and yaml; every name for -o name. A name missing from one kind is
    an error on stderr (exit 3) after what was found is printed."""
    from ..api.kinds import qualified as kind_name
    from ..reads import EVENTS, Listing, not_found

    sections: list[Listing | list[Any]] = []  # a kind's listing, or the event rows asked for
    missing: list[str] = []
    for kind, names in wanted:
        if kind in EVENTS:
            sections.append(client.events(names))
            continue
        listing = client.objects(kind, names, selector, strict=False)
        missing += [not_found(listing.kind, n) for n in listing.missing]
        sections.append(listing)
    found = [s for s in sections if (s.objects if isinstance(s, Listing) else s)]
    if fmt in ("json", "yaml"):
        items = [
            item
            for s in sections
            for item in ([o.manifest() for o in s.objects] if isinstance(s, Listing) else _event_items(s))
        ]
        typer.echo(_structured(items, fmt))
    elif fmt == "name":
        lines = [
            line
            for s in found
            for line in (
                [f"{kind_name(o.kind)}/{o.name}" for o in s.objects] if isinstance(s, Listing) else _event_names(s)
            )
        ]
        if lines:
            typer.echo("\n".join(lines))
    elif found:
        several = len(found) > 1
        tables = [
            _object_table(s, fmt == "wide", qualified=several) if isinstance(s, Listing) else _event_table(s)
            for s in found
        ]
        typer.echo("\n\n".join(tables))
    elif not missing:
        typer.echo("No resources found.", err=True)
    if missing:
        for line in missing:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(3)


def watch_listing(
    client: Client, kind: str, names: list[str], selector: str | None, fmt: str | None, events: bool = False
) -> None:
    """Print the listing, then each object again whenever it changes or goes (deleted, or no
    longer selected: a service leaving the registry), Ctrl-C ends, in the listing's format,
    as kubectl does: a table row, or the object as a JSON or YAML document, or its name; with
    `events` (kubectl's --output-watch-events) each says what happened: an EVENT column
    first, or `{"type", "object"}` documents."""
    from ..api.kinds import qualified as kind_name
    from ..reads import EVENTS, SERVICES, not_found

    if kind.lower() in EVENTS:
        listed = client.events(names)
        _print_events(listed, fmt)  # the listing, as kubectl prints it, even with events
        watch_events(client, names, fmt, events, listed)
        return
    label = "Service" if kind.lower() in SERVICES else _label(kind)
    narrow, wide_headers, row = COLUMNS[label]
    headers = narrow + (wide_headers if fmt == "wide" else [])
    try:
        # the listing printed is the one the changes start from: none falls between the two reads
        listing, changes = client.watch(kind, names, selector)
        if not events:
            _print_objects(listing, names, fmt)
        elif listing.missing:
            raise NotFound("; ".join(not_found(listing.kind, n) for n in listing.missing))
        # with events, the listing is in the stream, ADDED: one EVENT header, before the first of them
        header = f"{'EVENT':<9} " + table(headers, []).splitlines()[0] if events and fmt in (None, "wide") else None
        stream = itertools.chain((("ADDED", o) for o in listing.objects), changes) if events else changes
        for event, o in stream:
            if header is not None:
                typer.echo(header)
                header = None
            document: dict[str, Any] = o.manifest()
            if events:
                document = {"type": event, "object": document}
            if fmt == "json":
                typer.echo(dump_json(document))
            elif fmt == "yaml":
                typer.echo("---\n" + dump_yaml(document), nl=False)
            elif fmt == "name":
                typer.echo((f"{event} " if events else "") + f"{kind_name(o.kind)}/{o.name}")
            else:
                line = table(headers, [row(o, fmt == "wide")]).splitlines()[1]
                typer.echo(f"{event:<9} {line}" if events else line)
    except KeyboardInterrupt:
        return


def watch_events(client: Client, names: list[str], fmt: str | None, events: bool, listed: list[Any]) -> None:
    """Print each event recorded after the `listed` page (Ctrl-C ends), in the listing's
    format, looking at the newest page (`client.events`, locally or through a server) every
    EVENT_POLL."""
    import time

    from ..watching import EVENT_POLL, NewEvents

    new = NewEvents(listed)
    try:
        while True:
            time.sleep(EVENT_POLL)
            fresh = new.among(client.events(names))
            if not fresh:
                continue
            added = "ADDED     " if events else ""  # an event is never changed or deleted
            if fmt in ("json", "yaml"):
                for item in _event_items(fresh):
                    document = {"type": "ADDED", "object": item} if events else item
                    typer.echo(
                        dump_json(document) if fmt == "json" else "---\n" + dump_yaml(document), nl=fmt == "json"
                    )
            elif fmt == "name":
                typer.echo("\n".join(("ADDED " if events else "") + n for n in _event_names(fresh)))
            else:
                typer.echo("\n".join(added + line for line in _event_table(fresh).splitlines()[1:]))
    except KeyboardInterrupt:
        return
