"""The small error hierarchy every layer raises and the CLI maps to exit codes (API.md section 3)."""

from __future__ import annotations


class ReconcilerError(Exception):
    """Base: a failure the user should see as one clear line, never a traceback."""

    exit_code = 1


class InvalidInput(ReconcilerError):
    """Bad manifest, flag or argument. Nothing was changed."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = problems or [message]
        super().__init__(message)


class NotFound(ReconcilerError):
    exit_code = 3


class Conflict(ReconcilerError):
    """A stale resourceVersion, or a change refused in the object's current state."""

    exit_code = 4


class Unavailable(ReconcilerError):
    """Not now: the same request may succeed later (503; an agent retries it with backoff)."""


def first_line(exc: BaseException) -> str:
    """An error's first line, or its type's name when it says nothing: what one log or
    message line shows of it."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
