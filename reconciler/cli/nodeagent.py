"""`agent`: a node on another machine, serving the runs `reconciler serve` places on it."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import typer

from ..errors import InvalidInput
from .context import ctx_of


def agent(
    ctx: typer.Context,
    node: str = typer.Option(..., "--node", help="This node's name (a DNS-1123 label)."),
    token_file: str | None = typer.Option(None, "--token-file", help="A file holding the token alone."),
    labels: str | None = typer.Option(None, "--labels", help="Node labels: k=v,k2=v2."),
    label: list[str] = typer.Option([], "--label", help="A node label K=V (repeatable)."),
    slots: int | None = typer.Option(None, "--slots", min=0, help="Capacity in slots (default: CPU count)."),
    cpu: str | None = typer.Option(None, "--cpu", help="CPU capacity reported (e.g. 8)."),
    memory: str | None = typer.Option(None, "--memory", help="Memory capacity reported (e.g. 16Gi)."),
    log_port: int = typer.Option(
        9002, "--log-port", min=0, max=65535, help="Serve run logs to the server on this port (0: any free one)."
    ),
    log_host: str | None = typer.Option(
        None,
        "--log-host",
        help="Address the log port listens on (default: all with a token; without one, loopback only).",
    ),
    address: str | None = typer.Option(
        None, "--address", help="Where the server reaches this node (default: the address routed to the server)."
    ),
    state_dir: str | None = typer.Option(
        None, "--state-dir", help="Run folders and records (default: the user's state dir, agent-NODE)."
    ),
    tls_ca: str | None = typer.Option(None, "--tls-ca", help="PEM bundle that signs the server's certificate."),
) -> None:
    """Register this machine as NODE with the server (--server URL, --token TOKEN: global
    options), then run what is placed on it."""
    from ..api.meta import check_name
    from ..nodeagent.daemon import NodeAgent, Options, default_state_dir
    from ..server.serve import is_loopback

    server, token = ctx_of(ctx).server, ctx_of(ctx).token
    if not server:
        raise InvalidInput("agent: give --server URL (or RECONCILER_SERVER)")
    try:
        check_name(node)
    except ValueError as exc:
        raise InvalidInput(f"--node {node}: {exc}") from None
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise InvalidInput(f"--token-file {token_file}: {exc}") from None
    if log_host is None:
        log_host = "0.0.0.0" if token else "127.0.0.1"
    elif not token and not is_loopback(log_host):
        raise InvalidInput(
            f"--log-host {log_host}: without a token the log port has no authentication, so it listens on "
            "loopback only (127.0.0.1, ::1, localhost); give --token or --token-file to serve the server's machine"
        )
    pairs = [p for p in (labels or "").split(",") if p] + list(label)
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise InvalidInput(f"--labels: {pair!r} is not KEY=VALUE")
        parsed[key.strip()] = value.strip()
    options = Options(
        server=server,
        node=node,
        state_dir=Path(state_dir) if state_dir else default_state_dir(node),
        token=token,
        labels=parsed,
        slots=slots,
        cpu=cpu,
        memory=memory,
        log_port=log_port,
        log_host=log_host,
        address=address,
        verify=tls_ca if tls_ca else True,
    )
    from ..logsetup import process_log

    process_log()
    running = NodeAgent(options).start()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    print(
        f"agent of node {node}: server {server}, state {options.state_dir}, address {running.address}"
        + (f", logs on port {running.logs.port}" if running.logs is not None else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        running.wait()
    except KeyboardInterrupt:
        running.stop()
    if running.failed is not None:
        print(f"error: {running.failed}", file=sys.stderr, flush=True)
        os._exit(running.exit_code)  # 1: the node is another agent's; 2: a token the server refuses
    os._exit(0)  # the runs outlive the agent; nothing of this process needs a tidy interpreter exit


def register(app: typer.Typer) -> None:
    app.command()(agent)
