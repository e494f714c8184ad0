"""`serve`: the HTTP API (section 4 of API.md) with the controller, in one process."""

from __future__ import annotations

import typer

from ..errors import InvalidInput
from .context import NODE_ADDRESS, address_of, ctx_of, duration_of

MIN_LEASE = 1.0  # seconds: renewed every third of it, a shorter one would flap under load


def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; not loopback only with --tokens."),
    port: int = typer.Option(9001, "--port", help="Port to listen on."),
    tokens: str | None = typer.Option(
        None, "--tokens", help="Tokens file: one `TOKEN ROLE [NODE]` per line (roles admin, viewer, agent)."
    ),
    tls_cert: str | None = typer.Option(None, "--tls-cert", help="PEM certificate: serve HTTPS (with --tls-key)."),
    tls_key: str | None = typer.Option(None, "--tls-key", help="PEM private key of --tls-cert."),
    no_local_node: bool = typer.Option(
        False, "--no-local-node", help="This machine is no node: no Node registered, no run started here."
    ),
    workers: int = typer.Option(1, "--workers", help="Reconcile workers (as `controller --workers`)."),
    lease: str = typer.Option(
        "15s",
        "--lease",
        help="Controller lease period: of several servers on one store the holder runs the reconcile loop, "
        "and another takes over this long after it stops renewing.",
    ),
    node_address: str = NODE_ADDRESS,
    node_lost_after: str | None = typer.Option(
        None,
        "--node-lost-after",
        help="A node without a heartbeat this long is NotReady (default 40s, or RECONCILER_NODE_LOST_AFTER).",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Log each request and the controller's steps."),
) -> None:
    """The HTTP API plus the controller, with this machine as a node unless --no-local-node.
    Several servers may share a PostgreSQL store: all answer the API, the one holding the
    controller lease runs the controller (GET /leader tells which)."""
    from ..server.serve import check
    from ..server.serve import serve as run

    store_needed = ctx_of(ctx).local_only("serve")
    lost_after = duration_of(node_lost_after, "--node-lost-after")
    if lost_after is not None:
        from ..api.node import set_ready_window

        set_ready_window(lost_after)
    checked = check(host, tokens, tls_cert, tls_key)
    period = duration_of(lease, "--lease")
    if period is None or period < MIN_LEASE:
        raise InvalidInput(f"--lease {lease}: at least {MIN_LEASE:g}s (the leader renews it every third of it)")
    run(
        store_needed,
        host=host,
        port=port,
        tokens=checked,
        tls_cert=tls_cert,
        tls_key=tls_key,
        local_node=not no_local_node,
        address=address_of(node_address),
        workers=workers,
        verbose=verbose,
        lease=period,
    )


def register(app: typer.Typer) -> None:
    app.command()(serve)
