"""Fixtures for the crash tests: a temporary SQLite store per test, real controller
processes (optionally armed with RECONCILER_FAULT), everything killed at teardown."""

from __future__ import annotations

import pytest

from tests.crash.harness import Env


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()
