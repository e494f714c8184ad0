"""Time, injected: policies take `now` as a number; the runtime asks a Clock for it."""

from __future__ import annotations

import random
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...
    def monotonic(self) -> float: ...


class RealClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 1_800_000_000.0):
        self._now = start

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def jittered(interval: float, rand: random.Random | None = None) -> float:
    """90-110% of an interval, so pollers started together do not wake in lockstep."""
    return interval * (0.9 + 0.2 * (rand or random).random())
