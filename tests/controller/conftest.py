"""Shared helpers for the pure-policy tables: an injected clock and random source."""

from __future__ import annotations

from typing import Callable

import pytest

from reconciler.clock import FakeClock


def fixed(value: float) -> Callable[[], float]:
    """A random source that always returns `value` (0 = low end, 1 = high end)."""
    return lambda: value


def no_rand() -> float:
    """A random source for cases that must not consume randomness."""
    raise AssertionError("this decision must not draw a random number")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
