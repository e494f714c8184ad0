"""What every verb shares: the store it talks to (chosen by the global options), where
diagnostics go, and the parsing of flags that several verbs take."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import typer

from ..errors import InvalidInput

if TYPE_CHECKING:
    from ..selectors import Requirement
    from ..store import Store


@dataclass
class Context:
    store_url: str | None
    server: str | None

    @cached_property
    def store(self) -> Store:
        from ..store import Store  # imported when a verb needs it: `--help` and `explain` do not

        return Store(self.store_url)

    def close(self) -> None:
        """Release the store's connections when the verb is done (SQLite checkpoints and
        removes its -wal file on the last close), not whenever the interpreter gets to them."""
        if "store" in self.__dict__:
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
