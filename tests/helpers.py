"""Test helpers shared by every suite: the real CLI in a subprocess, and waiting with a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def run_cli(
    *args: str,
    store: str,
    input: str | None = None,
    timeout: float = 60,
    env: dict | None = None,
    cwd: str | None = None,
) -> Result:
    """Run `python -m reconciler ARGS` against `store`, as a user would."""
    full_env = {**os.environ, "RECONCILER_STORE": store, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def wait_until(predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.02, message: str = "") -> T:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {message or predicate}")
        time.sleep(interval)
