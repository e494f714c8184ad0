"""Fixtures for the crash tests: a temporary SQLite store per test, real controller
processes (optionally armed with RECONCILER_FAULT), everything killed at teardown."""

from __future__ import annotations

from tests.crash.harness import env  # noqa: F401  (the shared fixture)
