"""What every verb shares: where it acts (a store, or a server: the one place that chooses,
from the global options), where diagnostics go, and the parsing of flags that several
verbs take."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import typer

from ..errors import InvalidInput

if TYPE_CHECKING:
    from ..client import Client
    from ..selectors import Requirement
    from ..store import Store


@dataclass
class Context:
    store_url: str | None
    server: str | None
    token: str | None = None

    @cached_property
    def client(self) -> Client:
        """Where the verbs act: the server given by --server, else the store."""
        if self.server:
            from ..client.remote import RemoteClient

            return RemoteClient(self.server, self.token)
        from ..client.local import LocalClient

        return LocalClient(self.store)

    @cached_property
    def store(self) -> Store:
        """The store itself, for the verbs that run beside it (`controller`, `serve`)."""
        from ..store import Store  # imported when a verb needs it: `--help` and `explain` do not

        return Store(self.store_url)

    def local_only(self, verb: str) -> Store:
        """The store for a verb that cannot go through a server; refused with --server."""
        if self.server:
            raise InvalidInput(
                f"{verb} runs the reconcile loop beside the store, so it cannot go through --server {self.server}: "
                "run it where the store is (--store or RECONCILER_STORE), without --server"
            )
        return self.store

    def close(self) -> None:
        """Release the store's connections (or the server's) when the verb is done (SQLite
        checkpoints and removes its -wal file on the last close), not whenever the
        interpreter gets to them."""
        if "client" in self.__dict__:
            self.client.close()
        elif "store" in self.__dict__:
            self.store.dispose()


def ctx_of(ctx: typer.Context) -> Context:
    context: Context = ctx.obj
    return context


def err(message: str) -> None:
    """Diagnostics go to stderr, data to stdout, never mixed."""
    typer.echo(message, err=True)


def selector_of(text: str | None) -> list[Requirement] | None:
    """A -l label selector."""
    from ..selectors import parse

    return parse(text) if text else None


def duration_of(text: str | None, flag: str) -> float | None:
    """A duration flag (`--timeout 5m`); a bad one is invalid input naming the flag."""
    from ..api.quantity import parse_duration

    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise InvalidInput(f"{flag}: {exc}") from None


NODE_ADDRESS = typer.Option(
    "127.0.0.1",
    "--node-address",
    envvar="RECONCILER_NODE_ADDRESS",
    help="Where this node's services are reached; published in the service registry.",
)


def address_of(text: str) -> str:
    """--node-address: an IP address or a host name, as other machines reach this one."""
    import ipaddress
    import re

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if len(text) <= 253 and re.fullmatch(
        r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*", text
    ):
        return text
    raise InvalidInput(f"--node-address {text!r}: not an IP address or a host name")
