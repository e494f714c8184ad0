"""A real network of machines made of Linux network namespaces: the server in one, three
agents each in their own, joined to the server's by a veth pair each (10.77.N.1 on the
server's side, 10.77.N.2 on agent N's). Nothing is addressed outside the namespaces the
fixture makes, and it removes them (and every process it started) afterwards.

The test process stays in the root namespace: it reaches the server through the CLI run
inside the server's namespace (`Net.cli`), and reads job documents straight from the
store's file with the project's own `Store`, as the integration suite polls."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reconciler import reads
from reconciler.store import Store
from tests.helpers import Result, run_cli, wait_until
from tests.integration.conftest import epoch

PORT, LOG_PORT = 9001, 9002
LOST_AFTER = 3.0  # the server's --node-lost-after: NotReady after 3 s without a heartbeat
BEAT = 0.5  # the agents' heartbeat period (RECONCILER_HEARTBEAT_INTERVAL)
AGENTS = 3


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@dataclass
class Agent:
    index: int
    ns: str
    node: str
    token: str
    state: Path
    log: Path
    proc: subprocess.Popen | None = None


@dataclass
class Net:
    tag: str
    tmp: Path
    server_ns: str
    store_url: str
    admin: str
    viewer: str
    agents: list[Agent] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # the server side of each agent's veth pair
    procs: list[subprocess.Popen] = field(default_factory=list)
    server: subprocess.Popen | None = None
    _store: Store | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{PORT}"  # from inside the server's namespace

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RECONCILER_HEARTBEAT_INTERVAL": str(BEAT),
            "RECONCILER_NODE_LOST_AFTER": f"{LOST_AFTER:g}s",
            "NO_PROXY": "*",
        }

    def start_server(self) -> None:
        log = (self.tmp / "serve.log").open("a")
        argv = ["--store", self.store_url, "serve", "--host", "0.0.0.0", "--port", str(PORT)]
        argv += ["--tokens", str(self.tmp / "tokens"), "--no-local-node", "--node-lost-after", f"{LOST_AFTER:g}s"]
        self.server = self._spawn(self.server_ns, argv, log)
        wait_until(lambda: self.cli("get", "nodes").code == 0, timeout=30, interval=0.2, message="serve answers")

    def start_agent(self, agent: Agent, *extra: str) -> None:
        log = agent.log.open("a")
        argv = ["--server", f"http://10.77.{agent.index}.1:{PORT}", "--token", agent.token, "agent"]
        argv += ["--node", agent.node, "--slots", "2", "--log-port", str(LOG_PORT), "--state-dir", str(agent.state)]
        agent.proc = self._spawn(agent.ns, [*argv, *extra], log)

    def _spawn(self, ns: str, argv: list[str], log: Any) -> subprocess.Popen:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "reconciler", *argv],
            stdout=log,
            stderr=log,
            env=self.env(),
            start_new_session=True,
            cwd=self.tmp,
        )
        self.procs.append(proc)
        return proc

    def kill_agent(self, agent: Agent) -> None:
        """kill -9 of the agent process alone (its runs live on, in their own sessions)."""
        assert agent.proc is not None
        agent.proc.kill()
        agent.proc.wait(timeout=10)

    def ready_nodes(self) -> set[str]:
        """Nodes whose heartbeat is fresh, judged as the server judges them."""
        listing = reads.objects(self.store(), "nodes", [], None)
        now = time.time()
        return {
            o.name
            for o in listing.objects
            if now - epoch((o.status or {}).get("heartbeatAt") or "1970-01-01T00:00:00Z") < LOST_AFTER
        }

    def start_all(self) -> None:
        self.start_server()
        for agent in self.agents:
            self.start_agent(agent)
        names = {a.node for a in self.agents}
        wait_until(lambda: self.ready_nodes() >= names, timeout=30, interval=0.2, message="every agent registered")

    def link(self, agent: Agent, up: bool) -> None:
        """Cut (or heal) the wire between the server and one agent."""
        _ip("-n", self.server_ns, "link", "set", self.links[agent.index - 1], "up" if up else "down")

    def cli(self, *args: str, ns: str | None = None, token: str | None = None, timeout: float = 60) -> Result:
        """`reconciler --server URL ARGS` from inside the server's namespace (or `ns`)."""
        url = self.url if ns in (None, self.server_ns) else f"http://10.77.{ns[-1]}.1:{PORT}"
        proc = subprocess.run(
            [
                *("ip", "netns", "exec", ns or self.server_ns, sys.executable, "-m", "reconciler"),
                "--server",
                url,
                "--token",
                token or self.admin,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            cwd=self.tmp,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def on_store(self, *args: str) -> Result:
        """The CLI straight on the store (node maintenance verbs do not go through a server yet)."""
        return run_cli(*args, store=self.store_url, env={"RECONCILER_NODE_LOST_AFTER": f"{LOST_AFTER:g}s"})

    def http(self, ns: str, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        """One HTTP request from inside namespace `ns` to the server: (status, JSON answer)."""
        host = "127.0.0.1" if ns == self.server_ns else f"10.77.{ns[-1]}.1"
        code = (
            "import httpx, json, sys; a = sys.argv;"
            "h = {'Authorization': 'Bearer ' + a[3]} if a[3] else {};"
            "r = httpx.request(a[1], a[2], headers=h, json=json.loads(a[4]), timeout=10);"
            "print(r.status_code); print(r.text)"
        )
        url = f"http://{host}:{PORT}/apis/reconciler.dev/v1alpha1{path}"
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", code, method, url, token or "", json.dumps(body)],
            capture_output=True,
            text=True,
            timeout=30,
            env=self.env(),
        )
        assert proc.returncode == 0, proc.stderr
        status, _, text = proc.stdout.partition("\n")
        return int(status), json.loads(text) if text.strip() else None

    def apply(self, *documents: dict[str, Any]) -> None:
        path = self.tmp / f"apply-{secrets.token_hex(4)}.yaml"
        path.write_text("---\n".join(json.dumps(d) + "\n" for d in documents))  # JSON is YAML
        result = self.cli("apply", "-f", str(path))
        assert result.code == 0, result.stderr

    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.store_url)
        return self._store

    def status(self, name: str) -> dict[str, Any]:
        return reads.job_statuses(self.store(), [name]).get(name, {})

    def settled(self, *names: str, timeout: float = 60) -> dict[str, dict[str, Any]]:
        def done() -> dict[str, dict[str, Any]] | None:
            found = reads.job_statuses(self.store(), list(names))
            complete = all(found.get(n, {}).get("phase") == "Completed" for n in names)
            return found if complete else None

        return wait_until(done, timeout=timeout, interval=0.1, message=f"{names} completed")

    def running(self, name: str, timeout: float = 30) -> dict[str, Any]:
        """The job's open run, once it is Running."""

        def open_run() -> dict[str, Any] | None:
            status = self.status(name)
            runs = status.get("runs") or []
            if status.get("phase") == "Running" and runs and not runs[-1].get("finishedAt"):
                return runs[-1]
            return None

        return wait_until(open_run, timeout=timeout, interval=0.05, message=f"{name} running")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._kill_runs()
        if self._store is not None:
            self._store.dispose()
        for ns in [self.server_ns, *(a.ns for a in self.agents)]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)

    def _kill_runs(self) -> None:
        """Runs outlive their agents by design: the test's own are ended here."""
        import psutil

        marker = str(self.tmp)
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info.get("cmdline") or []
            if len(cmd) > 4 and cmd[3] == "reconciler-run" and cmd[4].startswith(marker):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.info["pid"], signal.SIGKILL)


def job(name: str, shell: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "reconciler.dev/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {"shell": shell, **spec},
    }


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    """The server's namespace and three agents' (not started: `net.start_all()`)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    tag = f"r{os.getpid() % 100000}{secrets.token_hex(1)}"
    admin, viewer = secrets.token_hex(16), secrets.token_hex(16)
    agents = [
        Agent(i, f"{tag}a{i}", f"n{i}", secrets.token_hex(16), tmp_path / f"agent{i}", tmp_path / f"agent{i}.log")
        for i in range(1, AGENTS + 1)
    ]
    lines = [f"{admin} admin", f"{viewer} viewer", *(f"{a.token} agent {a.node}" for a in agents)]
    (tmp_path / "tokens").write_text("\n".join(lines) + "\n")
    network = Net(tag, tmp_path, f"{tag}s", f"sqlite:///{tmp_path / 'state' / 'state.db'}", admin, viewer, agents)
    try:
        _ip("netns", "add", network.server_ns)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces are not available here: {exc.stderr!r}")
    try:
        _ip("-n", network.server_ns, "link", "set", "lo", "up")
        for agent in agents:
            _ip("netns", "add", agent.ns)
            _ip("-n", agent.ns, "link", "set", "lo", "up")
            server_side, agent_side = f"{tag}s{agent.index}", f"{tag}a{agent.index}"
            _ip(
                "link",
                "add",
                server_side,
                "netns",
                network.server_ns,
                "type",
                "veth",
                "peer",
                agent_side,
                "netns",
                agent.ns,
            )
            _ip("-n", network.server_ns, "addr", "add", f"10.77.{agent.index}.1/24", "dev", server_side)
            _ip("-n", agent.ns, "addr", "add", f"10.77.{agent.index}.2/24", "dev", agent_side)
            _ip("-n", network.server_ns, "link", "set", server_side, "up")
            _ip("-n", agent.ns, "link", "set", agent_side, "up")
            network.links.append(server_side)
        yield network
    finally:
        network.close()
