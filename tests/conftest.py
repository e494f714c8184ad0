"""Fixtures: a fresh SQLite store per test, and a fresh PostgreSQL database per test."""

from __future__ import annotations

import os
import uuid

import pytest

PG_ADMIN_URL = os.environ.get("RECONCILER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'state' / 'state.db'}"


@pytest.fixture
def pg_url():
    """A new, empty database on the local PostgreSQL server, dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    name = f"reconciler_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True)
    except psycopg.OperationalError as exc:  # pragma: no cover - CI starts the server
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """Both store back ends: tests using this run twice."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'state.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def http_server(monkeypatch):
    """A real HTTP server on loopback in a thread of the test (tests/artifacts.py), reached
    directly whatever proxy the environment names; stopped at teardown."""
    from tests.artifacts import serve

    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    state, httpd = serve()
    yield state
    state.release()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def _no_run_cgroup_left(request):
    """After a test that had a tmp_path, the cgroups of runs under it that no controller
    removed (the test stopped them itself) are removed: runs get real cgroups here."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is not None:
        from tests.helpers import remove_run_cgroups

        remove_run_cgroups(tmp)
