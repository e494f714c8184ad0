"""`get`: one listing function for every kind, plus `-w` watching for changes."""

from __future__ import annotations

import time

import typer

from ..api.kinds import KINDS, resolve_kind
from ..api.meta import from_epoch
from ..errors import NotFound
from ..selectors import Requirement, matches
from ..store import Store, StoredObject
from ..store import repository as repo
from .columns import COLUMNS
from .render import age, dump_json, dump_yaml, table
from .render import output as render_output

EVENT_HEADERS = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]


def _select(
    store: Store, kind: str, names: list[str], selector: list[Requirement] | None
) -> tuple[str, list[StoredObject]]:
    if kind.lower() in ("services", "service", "svc"):
        with store.read() as session:
            objs = [o for o in repo.list_objects(session, kind="Job") if o.spec.get("type") == "service"]
        label = "Service"
    else:
        info = resolve_kind(kind)
        with store.read() as session:
            objs = repo.list_objects(session, kind=info.kind, names=names or None)
        label = info.kind
    if label in ("Pool", "Node"):
        _with_usage(store, label, objs)
    if names:
        found = {o.name for o in objs}
        if missing := [n for n in names if n not in found]:
            raise NotFound("; ".join(f'{label.lower()}s "{n}" not found' for n in missing))
    if selector:
        objs = [o for o in objs if matches(selector, o.labels)]
    return label, objs


def _with_usage(store: Store, label: str, objs: list[StoredObject]) -> None:
    """Pool and node usage are derived from the admissions table, never stored twice."""
    from ..store.scheduling import usage

    with store.read() as session:
        used, queued, allocated = usage(session)
    for o in objs:
        status = dict(o.status or {})
        if label == "Pool":
            total = sum(used.values()) if o.name == "global" else used.get(o.name, 0)
            waiting = sum(queued.values()) if o.name == "global" else queued.get(o.name, 0)
            status.update(used=int(total or 0), queued=int(waiting or 0))
        else:
            status["allocated"] = {"slots": int(allocated.get(o.name, 0) or 0)}
        o.status = status


def _events(store: Store, names: list[str], fmt: str | None) -> str:
    with store.read() as session:
        rows = repo.events(session, limit=1000)
    if names:
        rows = [r for r in rows if r.name in names]
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


def print_listing(store: Store, kind: str, names: list[str], selector, fmt: str | None) -> None:
    if kind.lower() in ("events", "event", "ev"):
        typer.echo(_events(store, names, fmt))
        return
    label, objs = _select(store, kind, names, selector)
    if fmt in ("json", "yaml", "name"):
        qualified = lambda o: KINDS[o.kind].qualified  # noqa: E731
        text = render_output(objs, fmt, qualified, single=bool(names) and len(names) == 1)
        if text:
            typer.echo(text)
        return
    if not objs:
        typer.echo("No resources found.", err=True)
        return
    headers, wide_headers, row = COLUMNS[label]
    wide = fmt == "wide"
    typer.echo(table(headers + (wide_headers if wide else []), (row(o, wide) for o in objs)))


def watch_listing(store: Store, kind: str, names: list[str], selector, fmt: str | None, poll: float = 0.2) -> None:
    """Print each object again whenever its resourceVersion moves (Ctrl-C ends)."""
    if kind.lower() in ("events", "event", "ev"):
        return
    label, objs = _select(store, kind, names, selector)
    seen = {o.name: o.resource_version for o in objs}
    seq = store.change_seq()
    headers, wide_headers, row = COLUMNS[label]
    try:
        while True:
            time.sleep(poll)  # a CLI follower, not the controller: a short poll is the simple way
            current = store.change_seq()
            if current == seq:
                continue
            seq = current
            _, objs = _select(store, kind, names, selector)
            for o in objs:
                if seen.get(o.name) != o.resource_version:
                    seen[o.name] = o.resource_version
                    line = table(headers, [row(o, fmt == "wide")]).splitlines()[1]
                    typer.echo(line)
    except KeyboardInterrupt:
        return
