"""`reconciler serve`: refuse what would be unsafe, then run the API, and the controller while
this server holds the store's controller lease (several servers may share a store: one
leads, the others take over), in one process until SIGINT or SIGTERM."""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..converge import controller_elected
from ..errors import InvalidInput
from ..logsetup import process_log
from ..store import Store
from .app import create_app
from .auth import Tokens

GRACEFUL_SHUTDOWN = 3.0  # seconds open watch and log streams get when the server stops


def _stopping_server() -> type:
    import uvicorn

    class Stopping(uvicorn.Server):
        """uvicorn's server, which tells the app's long polls and streams to end when it is
        asked to stop (uvicorn then waits for them, up to GRACEFUL_SHUTDOWN, and cancels
        what is left with a traceback each)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            for stop in getattr(self.config.app, "on_exit", []):
                threading.Thread(target=stop, name="stopping", daemon=True).start()  # not in the signal handler
            super().handle_exit(sig, frame)

    return Stopping


def is_loopback(host: str) -> bool:
    """Only this machine can reach `host`: a loopback address, or a name all of whose
    addresses are loopback ones."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in found)


def check(host: str, tokens_file: str | None, tls_cert: str | None, tls_key: str | None) -> Tokens | None:
    """The tokens, after refusing (exit 2) a non-loopback host without them and half a TLS pair."""
    if (tls_cert is None) != (tls_key is None):
        raise InvalidInput("--tls-cert and --tls-key go together: give both, or neither")
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key), ("--tokens", tokens_file)):
        if path is not None and not Path(path).is_file():
            raise InvalidInput(f"{flag} {path}: no such file")
    tokens = Tokens.load(tokens_file) if tokens_file else None
    if tokens is None and not is_loopback(host):
        raise InvalidInput(
            f"--host {host}: without --tokens the API has no authentication, so it listens on loopback "
            "only (127.0.0.1, ::1, localhost); give --tokens FILE to serve other machines"
        )
    return tokens


def serve(
    store: Store,
    *,
    host: str,
    port: int,
    tokens: Tokens | None,
    tls_cert: str | None,
    tls_key: str | None,
    local_node: bool,
    workers: int,
    verbose: bool,
    address: str | None = None,
    lease: float,
) -> None:
    import uvicorn  # only `serve` pays for it

    process_log(verbose=verbose)  # the controller's log, as `controller` writes it
    with controller_elected(store, lease=lease, workers=workers, local_node=local_node, address=address) as elected:

        def wake(job: str) -> None:
            """An agent's report: the controller in this process (while it leads) looks at once."""
            hand = getattr(elected.leadership.running, "wake", None)  # None while this server follows
            if hand is not None:
                hand(job)

        def hand(write: Callable[..., Any], jobs: list[str]) -> Any:
            """An agent's reports: written in the batch of the controller in this process (while
            it leads), or None: the route writes them itself."""
            handoff = getattr(elected.leadership.running, "handoff", None)  # None while this server follows
            return None if handoff is None else handoff.hand(write, jobs)

        config = uvicorn.Config(
            create_app(store, tokens=tokens, leader=elected.leadership.describe, wake=wake, hand=hand),
            host=host,
            port=port,
            ssl_certfile=tls_cert,
            ssl_keyfile=tls_key,
            log_level="info" if verbose else "warning",
            access_log=verbose,
            timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN),
            server_header=False,
        )
        server = _stopping_server()(config)
        scheme = "https" if tls_cert else "http"
        node = f"node {elected.node}" if local_node else "no local node"
        auth = "tokens required" if tokens is not None else "no authentication: loopback only"
        term = elected.leadership.term
        role = f"leading in term {term}" if term is not None else "following the leader"
        print(
            f"serving {scheme}://{host}:{port} (store {store.display_url}, {node}, {auth}, {role})",
            file=sys.stderr,
            flush=True,
        )
        server.run()
