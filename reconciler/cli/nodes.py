"""Node maintenance: cordon, uncordon, drain [--force]."""

from __future__ import annotations

import typer

from ..errors import InvalidInput
from .context import ctx_of, duration_of, err

DRAIN_TIMEOUT = "5m"


def _node_name(ref: str) -> str:
    from ..api.kinds import split_ref

    info, name = split_ref(ref, default_kind="Node")
    if info.kind != "Node":
        raise InvalidInput(f"{ref}: only nodes can be cordoned or drained (node/NAME)")
    return name


def _set_unschedulable(ctx: typer.Context, refs: list[str], unschedulable: bool) -> None:
    client = ctx_of(ctx).client
    for name in [_node_name(r) for r in refs]:  # every ref checked before the first write
        typer.echo(f"node.reconciler.dev/{name} {client.set_unschedulable(name, unschedulable)}")


def cordon(ctx: typer.Context, refs: list[str] = typer.Argument(..., help="node/NAME ...")) -> None:
    """Mark nodes unschedulable: no new run is placed there; runs already there go on."""
    _set_unschedulable(ctx, refs, True)


def uncordon(ctx: typer.Context, refs: list[str] = typer.Argument(..., help="node/NAME ...")) -> None:
    """Mark nodes schedulable again."""
    _set_unschedulable(ctx, refs, False)


def drain(
    ctx: typer.Context,
    refs: list[str] = typer.Argument(..., help="node/NAME ..."),
    force: bool = typer.Option(
        False, "--force", help="Stop the runs there and record them Lost (NodeLost): the operator's word."
    ),
    timeout: str = typer.Option(DRAIN_TIMEOUT, "--timeout", help="How long to wait for the runs to end; 0 = forever."),
) -> None:
    """Cordon nodes, then wait until no run holds slots on them (exit 1 naming the runs
    still there when the timeout passes). --force stops those runs and records them Lost."""
    from ..drain import HeldRun

    names = [_node_name(r) for r in refs]
    limit = duration_of(timeout, "--timeout") or None
    client = ctx_of(ctx).client
    for name in names:
        done = client.drain(name, force=force)
        typer.echo(f"node.reconciler.dev/{name} {done.cordoned}")
        for job, number in done.declared_lost:
            err(f"job/{job} run {number} on node/{name}: declared lost (--force); it is stopped and recorded Lost")

    said: set[HeldRun] = set()

    def waiting(held: list[HeldRun]) -> None:
        """Say what is new since the last look: a run to wait for (or its new phase), a run gone."""
        for h in held:
            if h not in said:
                err(f"waiting for job/{h.job} run {h.run} ({h.phase}) on node/{h.node}")
        for gone in sorted({(h.node, h.job, h.run) for h in said} - {(h.node, h.job, h.run) for h in held}):
            err(f"job/{gone[1]} run {gone[2]} left node/{gone[0]}")
        said.clear()
        said.update(held)

    left = client.wait_drained(names, limit, waiting)
    if left:
        runs = ", ".join(f"job/{h.job} run {h.run} ({h.phase}) on node/{h.node}" for h in left)
        err(f"error: timed out waiting for the drain; still there: {runs}")
        raise typer.Exit(1)
    for name in names:
        typer.echo(f"node.reconciler.dev/{name} drained")


def register(app: typer.Typer) -> None:
    for verb in (cordon, uncordon, drain):
        app.command()(verb)
