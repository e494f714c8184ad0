"""Why a live run stops, as the run steps pass it around: a (reason, message) pair, and the
one stop that a request names by run (`drain --force` declaring a node's run lost). Apart
from runs.py so that the remote and service steps, which runs.py uses, can name it too."""

from __future__ import annotations

from ..api.annotations import lost_run
from .context import Ctx

Stop = tuple[str, str]  # (reason, message)


def drained(ctx: Ctx, number: int, node: str | None) -> Stop | None:
    """The stop `drain --force` asks for, when its request names this run on this node."""
    if lost_run(ctx.obj.annotations) != (number, node):
        return None
    return "NodeLost", f"node {node} was drained with --force: run {number} declared lost"
