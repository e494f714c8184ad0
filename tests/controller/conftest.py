"""Shared helpers for the pure-policy tables: injected random sources. (Clocks are injected as
plain numbers from reconciler.clock.FakeClock, since policies take `now` as an argument.)"""

from __future__ import annotations

from collections.abc import Callable


def fixed(value: float) -> Callable[[], float]:
    """A random source that always returns `value` (0 = low end, 1 = high end)."""
    return lambda: value


def no_rand() -> float:
    """A random source for decisions that must not draw a random number."""
    raise AssertionError("this decision must not draw a random number")
