"""Fixtures for the HTTP API: a real `reconciler serve` subprocess on a free loopback port
over a fresh store, real HTTP (httpx), and the real CLI with --server."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.helpers import Result, remove_run_cgroups, run_cli, wait_until

PREFIX = "/apis/reconciler.dev/v1alpha1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    store: str
    proc: subprocess.Popen
    log: Path
    token: str | None = None
    verify: ssl.SSLContext | bool = True
    clients: list[httpx.Client] = field(default_factory=list)

    def http(self, token: str | None = None) -> httpx.Client:
        """An HTTP client for the server; with `token` (default: the fixture's admin token)."""
        token = token if token is not None else self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=30, verify=self.verify)
        self.clients.append(client)
        return client

    def cli(self, *args: str, token: str | None = None, timeout: float = 60, env: dict | None = None) -> Result:
        """`reconciler --server URL ARGS` (RECONCILER_STORE set too: --server must win over it)."""
        extra = {"RECONCILER_SERVER": self.url, **(env or {})}
        if token or self.token:
            extra["RECONCILER_TOKEN"] = token or self.token or ""
        return run_cli(*args, store=self.store, timeout=timeout, env=extra)

    def local(self, *args: str, timeout: float = 60) -> Result:
        """The same verb straight on the store."""
        return run_cli(*args, store=self.store, timeout=timeout)

    def job(self, name: str) -> dict:
        return self.http().get(f"{PREFIX}/jobs/{name}").json()


def start_server(
    store: str,
    tmp_path: Path,
    *args: str,
    token: str | None = None,
    scheme: str = "http",
    verify: ssl.SSLContext | bool = True,
    env: dict[str, str] | None = None,
) -> Server:
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    output = log.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "--store", store, "serve", "--port", str(port), *args],
        stdout=output,
        stderr=output,
        start_new_session=True,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )
    server = Server(f"{scheme}://127.0.0.1:{port}", store, proc, log, token, verify)

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{server.url}/healthz", timeout=2, verify=verify).text == "ok"
        return False

    wait_until(healthy, timeout=30, interval=0.1, message="serve answers /healthz")
    return server


def stop_server(server: Server) -> None:
    for client in server.clients:
        client.close()
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()


@pytest.fixture
def serve(tmp_path) -> Iterator[Callable[..., Server]]:
    """Start `reconciler serve` with these arguments; stopped after the test."""
    started: list[Server] = []

    def start(store: str, *args: str, **kwargs) -> Server:
        server = start_server(store, tmp_path, *args, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        stop_server(server)
    remove_run_cgroups(tmp_path)


@pytest.fixture
def server(serve, sqlite_url) -> Server:
    """A server over a fresh SQLite store, this machine its node."""
    return serve(sqlite_url)


def job_manifest(name: str, command: list[str] | None = None, **spec) -> dict:
    return {
        "apiVersion": "reconciler.dev/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {"command": command or ["true"], **spec},
    }


def settled(server: Server, *names: str) -> dict[str, dict]:
    """Wait until the named jobs are Completed; their documents."""

    def done() -> dict[str, dict] | None:
        docs = {n: server.job(n) for n in names}
        return docs if all(d.get("status", {}).get("phase") == "Completed" for d in docs.values()) else None

    return wait_until(done, timeout=60, interval=0.1, message=f"{names} completed")
