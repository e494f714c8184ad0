"""Declarative verbs: apply, diff, get, describe, delete."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

import typer

from ..errors import InvalidInput
from .context import ctx_of, err, selector_of

if TYPE_CHECKING:
    from ..manifests import Loaded, Manifest
    from ..store import StoredObject

OUTPUTS = ("wide", "yaml", "json", "name")


def read_manifests(files: list[str], recursive: bool, *, verb: str, warn: bool = True) -> Loaded:
    """What -f paths hold, problems included (the verb reports them with its own); a
    `status` in a manifest is ignored, with a warning."""
    from ..manifests import read

    if not files:
        raise InvalidInput("no manifests given: use -f PATH (a file, a folder, or - for stdin)")
    loaded = read(files, recursive=recursive, verb=verb)
    for m in loaded.manifests:
        if m.ignored_status and warn:
            err(f"warning: {m.where('status')} is written only by the system; ignored")
    return loaded


def load_manifests(files: list[str], recursive: bool, *, verb: str, warn: bool = True) -> list[Manifest]:
    """The manifests of -f paths, or InvalidInput naming every problem."""
    from ..manifests import invalid

    loaded = read_manifests(files, recursive, verb=verb, warn=warn)
    if loaded.problems:
        raise invalid(loaded.problems)
    return loaded.manifests


def apply(
    ctx: typer.Context,
    filename: list[str] = typer.Option([], "-f", "--filename", help="File, folder or - for stdin; repeatable."),
    recursive: bool = typer.Option(False, "-R", "--recursive", help="Read folders recursively."),
    prune: bool = typer.Option(False, "--prune", help="Delete applied objects (matching -l) that are not in this set."),
    selector: str | None = typer.Option(
        None, "-l", "--selector", help="Apply (and with --prune, prune) only the objects it matches."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and report, store nothing."),
    force: bool = typer.Option(False, "--force", help="Allow changing an active job: its run is stopped."),
    output: str | None = typer.Option(None, "-o", "--output", help="name | json"),
) -> None:
    """Create or update objects from manifests; one apply is one transaction."""
    from .render import as_list, dump_json

    if output not in (None, "name", "json"):
        raise InvalidInput(f"--output {output!r}: must be name or json")
    manifests = read_manifests(filename, recursive, verb="apply")
    selector_of(selector)  # a bad selector is refused before anything is written
    changes = ctx_of(ctx).client.apply(manifests, dry_run=dry_run, force=force, prune=prune, selector=selector)
    suffix = " (dry run)" if dry_run else ""
    if output == "json":  # as kubectl prints: one object as itself, several as a List
        documents = [d for c in changes if (d := c.after or c.before) is not None]
        typer.echo(dump_json(documents[0] if len(documents) == 1 else as_list(documents)))
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
    force: bool = typer.Option(
        False, "--force", help="What apply --force would change (an active job's new spec: its run is stopped)."
    ),
) -> None:
    """Show what apply would change; exit 0 when nothing, 1 when something."""
    from .render import dump_yaml

    manifests = read_manifests(filename, recursive, verb="diff")
    changes = ctx_of(ctx).client.apply(manifests, dry_run=True, force=force, selector=None)
    changed = False
    for c in changes:
        if c.action == "unchanged" or c.after is None:
            continue
        changed = True
        # both sides in one canonical (sorted) order: a changed field shows as one line
        before = dump_yaml(_comparable(c.before), sort_keys=True).splitlines(keepends=True) if c.before else []
        after = dump_yaml(_comparable(c.after), sort_keys=True).splitlines(keepends=True)
        label = f"{c.kind.qualified}/{c.name}"
        typer.echo("".join(difflib.unified_diff(before, after, f"live/{label}", f"applied/{label}")), nl=False)
    raise typer.Exit(1 if changed else 0)


def _comparable(document: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in document["metadata"].items() if k in ("name", "labels", "annotations")}
    return {"apiVersion": document["apiVersion"], "kind": document["kind"], "metadata": meta, "spec": document["spec"]}


def get(
    ctx: typer.Context,
    kind: str = typer.Argument(
        ...,
        help="jobs | pools | nodes | notifiers | sources | services | events; several as jobs,pools; or KIND/NAME...",
    ),
    names: list[str] = typer.Argument(None),
    selector: str | None = typer.Option(None, "-l", "--selector"),
    output: str | None = typer.Option(None, "-o", "--output", help="wide | yaml | json | name"),
    watch: bool = typer.Option(False, "-w", "--watch", help="After listing, print changes as they happen."),
    watch_events: bool = typer.Option(
        False, "--output-watch-events", help="With -w: say what each change is (ADDED, MODIFIED, DELETED)."
    ),
) -> None:
    """List objects of one kind or several (jobs,pools: a table each, or one List)."""
    from .listing import print_kinds, print_listing, targets, watch_listing

    if output not in (None, *OUTPUTS):
        raise InvalidInput(f"--output {output!r}: must be one of {', '.join(OUTPUTS)}")
    wanted = targets(kind, names or [])
    if watch and len(wanted) > 1:
        raise InvalidInput("get -w: watch one kind at a time")
    if watch_events and not watch:
        raise InvalidInput("--output-watch-events: only with -w")
    selector_of(selector)  # a bad selector is refused before anything is asked
    client = ctx_of(ctx).client
    if len(wanted) > 1:
        print_kinds(client, wanted, selector, output)
        return
    kind, names = wanted[0]
    if watch:  # the listing, then its changes: printed by the watch, from one read
        watch_listing(client, kind, names, selector, output, watch_events)
    else:
        print_listing(client, kind, names, selector, output)


def describe(ctx: typer.Context, kind: str = typer.Argument(...), name: str | None = typer.Argument(None)) -> None:
    """Everything about one object."""
    from ..api.kinds import split_ref
    from ..reads import SERVICES
    from .describe import describe_object

    client = ctx_of(ctx).client
    prefix, _, rest = kind.partition("/")
    if prefix.lower() in SERVICES and (name is None) == bool(rest):
        # a service of the registry, derived from its job: the entry, and its job's events
        service = client.objects("services", [rest or str(name)], None).objects[0]
        typer.echo(describe_object(service, client.describe("Job", service.name)[1]))
        return
    if name is None:
        info, name = split_ref(kind)
        kind = info.kind
    obj, events = client.describe(kind, name)
    # a node's jobs, as `kubectl describe node` lists its pods: those holding slots on it
    held = (
        [j for j in client.objects("Job", [], None).objects if _holds_slots_on(j, obj.name)]
        if obj.kind == "Node"
        else []
    )
    typer.echo(describe_object(obj, events, held))


def _holds_slots_on(job: StoredObject, node: str) -> bool:
    status = job.status or {}
    return bool(status.get("admission")) and status.get("nodeName") == node


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

    targets: list[tuple[str, str]] = []
    by_kind = None
    if selector and (names or filename or (kind and "/" in kind)):  # not silently one or the other
        raise InvalidInput("delete: name objects (or give -f) or select them with -l, not both")
    if filename:
        targets = [(m.kind.kind, m.name) for m in load_manifests(filename, recursive, verb="delete", warn=False)]
    elif kind and "/" in kind:
        targets = [(split_ref(ref)[0].kind, split_ref(ref)[1]) for ref in [kind, *(names or [])]]
    elif kind:
        info = resolve_kind(kind)
        if not names and not selector:
            raise InvalidInput(f"delete {kind}: name the objects, or select them with -l")
        targets = [(info.kind, n) for n in names or []]
        by_kind = info.kind if not names else None
    elif not selector:
        raise InvalidInput("delete: give KIND NAME..., KIND/NAME, -f PATH, or -l SELECTOR (with or without a KIND)")
    selector_of(selector)
    result = ctx_of(ctx).client.delete(targets, kind=by_kind, selector=selector)
    for o, what in result.done:
        typer.echo(f"{KINDS[o.kind].qualified}/{o.name} {what}")
    if selector and not result.done:
        err("No resources found.")
    for k, n in result.missing:
        err(f'error: {KINDS[k].plural} "{n}" not found')
    if result.missing:
        raise typer.Exit(3)
