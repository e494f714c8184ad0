"""Declarative verbs: apply, diff, get, describe, delete."""

from __future__ import annotations

import difflib

import typer

from ..errors import InvalidInput, NotFound
from .context import ctx_of, err

OUTPUTS = ("wide", "yaml", "json", "name")


def _selector(text: str | None):
    from ..selectors import parse

    return parse(text) if text else None


def _load(files: list[str], recursive: bool, *, warn: bool = True):
    from ..manifests import load

    if not files:
        raise InvalidInput("no manifests given: use -f PATH (a file, a folder, or - for stdin)")
    manifests = load(files, recursive=recursive)
    for m in manifests:
        if m.ignored_status and warn:
            err(f"warning: {m.where('status')} is written only by the system; ignored")
    return manifests


def apply(
    ctx: typer.Context,
    filename: list[str] = typer.Option([], "-f", "--filename", help="File, folder or - for stdin; repeatable."),
    recursive: bool = typer.Option(False, "-R", "--recursive", help="Read folders recursively."),
    prune: bool = typer.Option(False, "--prune", help="Delete applied objects (matching -l) that are not in this set."),
    selector: str | None = typer.Option(None, "-l", "--selector", help="With --prune: only prune matching objects."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and report, store nothing."),
    force: bool = typer.Option(False, "--force", help="Allow changing an active job: its run is stopped."),
    output: str | None = typer.Option(None, "-o", "--output", help="name | json"),
) -> None:
    """Create or update objects from manifests; one apply is one transaction."""
    from ..apply import apply_manifests
    from .render import as_list, dump_json

    if output not in (None, "name", "json"):
        raise InvalidInput(f"--output {output!r}: must be name or json")
    manifests = _load(filename, recursive)
    changes = apply_manifests(
        ctx_of(ctx).store, manifests, dry_run=dry_run, force=force, prune=prune, selector=_selector(selector)
    )
    suffix = " (dry run)" if dry_run else ""
    if output == "json":
        typer.echo(dump_json(as_list([c.after or c.before for c in changes])))
        return
    if changes:  # one write: a line per object, and an apply may hold thousands
        typer.echo(
            "\n".join(
                f"{c.kind.qualified}/{c.name}"
                if output == "name"
                else f"{c.kind.qualified}/{c.name} {c.action}{suffix}"
                for c in changes
            )
        )


def diff(
    ctx: typer.Context,
    filename: list[str] = typer.Option([], "-f", "--filename"),
    recursive: bool = typer.Option(False, "-R", "--recursive"),
) -> None:
    """Show what apply would change; exit 0 when nothing, 1 when something."""
    from ..apply import apply_manifests
    from .render import dump_yaml

    changes = apply_manifests(ctx_of(ctx).store, _load(filename, recursive), dry_run=True)
    changed = False
    for c in changes:
        if c.action == "unchanged":
            continue
        changed = True
        before = dump_yaml(_comparable(c.before)).splitlines(keepends=True) if c.before else []
        after = dump_yaml(_comparable(c.after)).splitlines(keepends=True)
        label = f"{c.kind.qualified}/{c.name}"
        typer.echo("".join(difflib.unified_diff(before, after, f"live/{label}", f"applied/{label}")), nl=False)
    raise typer.Exit(1 if changed else 0)


def _comparable(document: dict) -> dict:
    meta = {k: v for k, v in document["metadata"].items() if k in ("name", "labels", "annotations")}
    return {"apiVersion": document["apiVersion"], "kind": document["kind"], "metadata": meta, "spec": document["spec"]}


def get(
    ctx: typer.Context,
    kind: str = typer.Argument(..., help="jobs | pools | nodes | notifiers | services | events"),
    names: list[str] = typer.Argument(None),
    selector: str | None = typer.Option(None, "-l", "--selector"),
    output: str | None = typer.Option(None, "-o", "--output", help="wide | yaml | json | name"),
    watch: bool = typer.Option(False, "-w", "--watch", help="After listing, print changes as they happen."),
) -> None:
    """List objects."""
    from .listing import print_listing, watch_listing

    if output not in (None, *OUTPUTS):
        raise InvalidInput(f"--output {output!r}: must be one of {', '.join(OUTPUTS)}")
    store = ctx_of(ctx).store
    print_listing(store, kind, names or [], _selector(selector), output)
    if watch:
        watch_listing(store, kind, names or [], _selector(selector), output)


def describe(ctx: typer.Context, kind: str = typer.Argument(...), name: str | None = typer.Argument(None)) -> None:
    """Everything about one object."""
    from ..api.kinds import resolve_kind, split_ref
    from ..store import repository as repo
    from .describe import describe_object

    info, name = split_ref(kind) if name is None else (resolve_kind(kind), name)
    store = ctx_of(ctx).store
    with store.read() as session:
        obj = repo.get(session, kind=info.kind, name=name)
        if obj is None:
            raise NotFound(f'{info.plural} "{name}" not found')
        events = repo.events(session, kind=info.kind, name=name, limit=50)
    typer.echo(describe_object(obj, events, store))


def delete(
    ctx: typer.Context,
    kind: str | None = typer.Argument(None),
    names: list[str] = typer.Argument(None),
    filename: list[str] = typer.Option([], "-f", "--filename"),
    recursive: bool = typer.Option(False, "-R", "--recursive"),
    selector: str | None = typer.Option(None, "-l", "--selector"),
) -> None:
    """Delete objects by name, by manifest or by label; an active job is cancelled first."""
    from ..api.kinds import KINDS, resolve_kind, split_ref
    from ..apply import delete_object
    from ..selectors import matches
    from ..store import repository as repo

    targets: list[tuple[str, str]] = []
    if filename:
        targets = [(m.kind.kind, m.name) for m in _load(filename, recursive, warn=False)]
    elif kind and "/" in kind:
        targets = [(split_ref(ref)[0].kind, split_ref(ref)[1]) for ref in [kind, *(names or [])]]
    elif kind:
        info = resolve_kind(kind)
        if not names and not selector:
            raise InvalidInput(f"delete {kind}: name the objects, or select them with -l")
        targets = [(info.kind, n) for n in names or []]
    else:
        raise InvalidInput("delete: give KIND NAME..., KIND/NAME, -f PATH or KIND -l SELECTOR")
    requirements = _selector(selector)
    missing = []
    with ctx_of(ctx).store.write() as tx:
        if requirements and kind and not names:
            objs = [
                o
                for o in repo.list_objects(tx.session, kind=resolve_kind(kind).kind)
                if matches(requirements, o.labels)
            ]
        else:
            objs = []
            for k, n in targets:
                obj = repo.get(tx.session, kind=k, name=n)
                (objs.append(obj) if obj else missing.append((k, n)))
        # jobs before the pools they use, so one `delete -f` of a whole folder works
        order = {"Job": 0, "Notifier": 1, "Pool": 2, "Node": 3}
        done = [(o, delete_object(tx, o)) for o in sorted(objs, key=lambda o: order[o.kind])]
    for o, what in done:
        typer.echo(f"{KINDS[o.kind].qualified}/{o.name} {what}")
    for k, n in missing:
        err(f'Error: {KINDS[k].plural} "{n}" not found')
    if missing:
        raise typer.Exit(3)
