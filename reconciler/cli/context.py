"""What every verb shares: the store it talks to, chosen by the global options."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import typer


@dataclass
class Context:
    store_url: str | None
    server: str | None

    @cached_property
    def store(self):
        from ..store import Store  # imported lazily: `--help` must not pay for SQLAlchemy

        return Store(self.store_url)

    def close(self) -> None:
        """Release the store's connections when the verb is done (SQLite checkpoints and
        removes its -wal file on the last close), not whenever the interpreter gets to them."""
        if "store" in self.__dict__:
            self.store.dispose()


def ctx_of(ctx: typer.Context) -> Context:
    return ctx.obj


def err(message: str) -> None:
    """Diagnostics go to stderr, data to stdout, never mixed."""
    typer.echo(message, err=True)
