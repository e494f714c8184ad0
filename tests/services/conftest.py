"""Fixtures for service jobs: a temporary SQLite store and one real `reconciler controller`
process per test; the controller and every process a run left behind are killed at teardown."""

from __future__ import annotations

import pytest

from tests.crash.harness import env  # noqa: F401  (the shared fixture)


@pytest.fixture
def controller(env):  # noqa: F811  (pytest injects the imported fixture)
    return env.start_controller()
