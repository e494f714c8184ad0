"""Figure 18, remote agents: N jobs of `sleep 0.05` over three `reconciler agent`s of 2 slots
each, each agent in its own network namespace joined to the server's by a veth pair (three
machines on one), against the embedded controller (`serve` with this machine as a 6-slot
node) running the same jobs; and the placement-to-start latency on a remote agent: from the
admission (the Admitted event, written in the admission's transaction) to the process's start
as the agent recorded it (the run's startedAt; one machine, one clock); and a chain of
/bin/true over the agents against the same chain on the embedded controller, per link:
(the chain's time - a one-job graph's) / (links - 1), from outside.

Both sides are `reconciler serve` over a fresh SQLite store, the jobs applied with one
`reconciler apply` and timed from its return to the last completion. Without network
namespaces (not root, no `ip`), the agents run on loopback in this namespace, and the row
says so.

    .venv/bin/python bench/agents.py --jobs 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, Row, log, scratch

AGENTS, SLOTS = 3, 2
PORT = 9001


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ip(*args: str) -> bool:
    return subprocess.run(["ip", *args], capture_output=True, timeout=20).returncode == 0


class Cluster:
    """A server and three agents: in namespaces when possible, else on loopback. The server
    has a namespace of its own, or (`host_server`: it must reach a PostgreSQL on this
    machine's loopback) stays in this one, each agent's veth pair ending here."""

    def __init__(self, url: str, folder: Path, slots: int = SLOTS, host_server: bool = False):
        self.url, self.folder, self.slots, self.host_server = url, folder, slots, host_server
        self.tag = f"rb{os.getpid() % 100000}"
        self.namespaces: list[str] = []
        self.links: list[str] = []  # veth ends in this namespace (host_server), deleted at close
        self.procs: list[subprocess.Popen] = []
        self.server: subprocess.Popen | None = None
        self.agents: list[subprocess.Popen] = []
        self.net = _free_subnet() if host_server else 77
        server_ns = None if host_server else f"{self.tag}s"
        self.isolated = os.geteuid() == 0 and (server_ns is None or _ip("netns", "add", server_ns))
        if self.isolated:
            at = ["-n", server_ns] if server_ns else []
            if server_ns:
                self.namespaces.append(server_ns)
                _ip(*at, "link", "set", "lo", "up")
            for i in range(1, AGENTS + 1):
                ns, near, far = f"{self.tag}a{i}", f"{self.tag}s{i}", f"{self.tag}a{i}"
                ok = _ip("netns", "add", ns)
                self.namespaces.append(ns)
                near_ns = ["netns", server_ns] if server_ns else []
                ok = ok and _ip("link", "add", near, *near_ns, "type", "veth", "peer", far, "netns", ns)
                if ok and not server_ns:
                    self.links.append(near)
                ok = ok and _ip(*at, "addr", "add", f"10.{self.net}.{i}.1/24", "dev", near)
                ok = ok and _ip("-n", ns, "addr", "add", f"10.{self.net}.{i}.2/24", "dev", far)
                ok = ok and _ip(*at, "link", "set", near, "up") and _ip("-n", ns, "link", "set", far, "up")
                ok = ok and _ip("-n", ns, "link", "set", "lo", "up")
                if not ok:
                    self.close()
                    raise RuntimeError("could not make the namespaces' network")
        self.port = PORT if self.isolated and not host_server else _free_port()

    def _spawn(self, ns: str | None, argv: list[str], name: str) -> subprocess.Popen:
        prefix = ["ip", "netns", "exec", ns] if ns else []
        proc = subprocess.Popen(
            [*prefix, PYTHON, "-m", "reconciler", *argv],
            stdout=subprocess.DEVNULL,
            stderr=(self.folder / f"{name}.log").open("w"),
            start_new_session=True,
            env={**os.environ, "NO_PROXY": "*"},
        )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        host = "0.0.0.0" if self.isolated else "127.0.0.1"
        argv = ["--store", self.url, "serve", "--host", host, "--port", str(self.port), "--no-local-node"]
        if self.isolated:
            token = secrets.token_hex(16)
            (self.folder / "tokens").write_text(f"{token} admin\n")
            argv += ["--tokens", str(self.folder / "tokens")]
        self.server = self._spawn(self.namespaces[0] if self.isolated and not self.host_server else None, argv, "serve")
        for i in range(1, AGENTS + 1):
            server = f"http://10.{self.net}.{i}.1:{self.port}" if self.isolated else f"http://127.0.0.1:{self.port}"
            argv = ["--server", server]
            if self.isolated:
                argv += ["--token", token]
            argv += ["agent", "--node", f"n{i}", "--slots", str(self.slots), "--log-port", "0"]
            argv += ["--state-dir", str(self.folder / f"agent{i}")]
            ns = self.namespaces[i - 1 + (not self.host_server)] if self.isolated else None
            self.agents.append(self._spawn(ns, argv, f"agent{i}"))
        _wait_ready_nodes(self.url, AGENTS)

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for link in self.links:
            _ip("link", "del", link)
        for ns in self.namespaces:
            _ip("netns", "del", ns)


def _free_subnet() -> int:
    """N of a 10.N.0.0/16 no interface of this namespace uses (the agents' veth pairs end here)."""
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=20).stdout
    for n in range(78, 250):
        if f" 10.{n}." not in used:
            return n
    raise RuntimeError("no free 10.N.0.0/16 for the agents' network")


def _wait_ready_nodes(url: str, count: int, limit: float = 60.0) -> None:
    from reconciler import reads
    from reconciler.store import Store

    store = Store(url)
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            nodes = reads.objects(store, "nodes", [], None).objects
            if sum(1 for n in nodes if (n.status or {}).get("heartbeatAt")) >= count:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{count} nodes did not register within {limit:g}s")
    finally:
        store.dispose()


def _manifests(folder: Path, jobs: int, command: tuple[str, ...] = ("sleep", "0.05"), prefix: str = "j") -> Path:
    """`jobs` jobs of `command`, no dependencies, in one file (JSON documents are YAML)."""
    path = folder / "jobs.yaml"
    docs = [
        json.dumps(
            {
                "apiVersion": "reconciler.dev/v1alpha1",
                "kind": "Job",
                "metadata": {"name": f"{prefix}{i:05d}"},
                "spec": {"command": list(command)},
            }
        )
        for i in range(jobs)
    ]
    path.write_text("---\n".join(d + "\n" for d in docs))
    return path


def _completed(url: str, jobs: int, limit: float) -> float:
    """Seconds until every job is Completed, polling the store."""
    from reconciler.store import Store
    from reconciler.store.dbapi import Statement

    count = Statement("SELECT count(*) FROM objects WHERE kind = 'Job' AND phase = 'Completed'")
    store = Store(url)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < limit:
            with store.read() as conn:
                if int(count.execute(conn).scalar()) >= jobs:
                    return time.monotonic() - t0
            time.sleep(0.02)
        raise RuntimeError(f"{jobs} jobs did not complete within {limit:g}s")
    finally:
        store.dispose()


def _apply(url: str, path: Path, env: dict[str, str] | None = None) -> float:
    """`reconciler apply -f PATH`; its wall time."""
    t0 = time.monotonic()
    subprocess.run(
        [PYTHON, "-m", "reconciler", "--store", url, "apply", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=600,
        env=env,
    )
    return time.monotonic() - t0


def _outcomes_and_latency(url: str) -> tuple[int, list[float]]:
    """(jobs Succeeded, placement-to-start seconds of each run)."""
    from reconciler.api.meta import to_epoch
    from reconciler.store import Store
    from reconciler.store.dbapi import Statement

    store = Store(url)
    try:
        with store.read() as conn:
            admitted = {
                r.name: r.time
                for r in Statement("SELECT name, time FROM events WHERE kind = 'Job' AND reason = 'Admitted'").execute(
                    conn
                )
            }
            rows = Statement("SELECT name, status FROM objects WHERE kind = 'Job'").execute(conn).all()
    finally:
        store.dispose()
    ok, latencies = 0, []
    for name, text in rows:
        status = json.loads(text or "{}")
        ok += status.get("outcome") == "Succeeded"
        runs = status.get("runs") or []
        if runs and name in admitted and runs[0].get("startedAt"):
            latencies.append(to_epoch(runs[0]["startedAt"]) - admitted[name])
    return ok, latencies


def _chain(folder: Path, links: int, prefix: str) -> Path:
    """A chain of `links` jobs of /bin/true, each depending on the one before."""
    path = folder / f"{prefix}.yaml"
    docs = []
    for i in range(links):
        spec: dict[str, object] = {"command": ["/bin/true"]}
        if i:
            spec["dependsOn"] = [f"{prefix}{i - 1:05d}"]
        meta = {"name": f"{prefix}{i:05d}"}
        docs.append(
            json.dumps({"apiVersion": "reconciler.dev/v1alpha1", "kind": "Job", "metadata": meta, "spec": spec})
        )
    path.write_text("---\n".join(d + "\n" for d in docs))
    return path


def per_link(url: str, folder: Path, links: int, done: int) -> float:
    """Seconds a link of a chain of /bin/true takes, from outside: (the chain's time to its
    last completion - a one-job graph's, the best of three) / (links - 1), so that what a
    graph costs once (the apply's return, the first placement) cancels. `done`: the jobs
    already in the store, all Completed (the count polled for includes them)."""

    def graph(n: int, prefix: str) -> float:
        nonlocal done
        _apply(url, _chain(folder, n, prefix))
        done += n
        return _completed(url, done, limit=600)

    one = min(graph(1, f"one{k}-") for k in range(3))
    return (graph(links, "link-") - one) / (links - 1)


def _timed(url: str, folder: Path, jobs: int, side: str) -> tuple[float, list[float]]:
    """Apply the jobs; (seconds until all are Completed, placement-to-start of each run)."""
    _apply(url, _manifests(folder, jobs))
    took = _completed(url, jobs, limit=600)
    ok, latencies = _outcomes_and_latency(url)
    if ok != jobs:
        raise RuntimeError(f"{side}: {ok} of {jobs} jobs succeeded")
    return took, latencies


@contextlib.contextmanager
def local_serve(url: str, folder: Path, slots: int, env: dict[str, str] | None = None) -> Iterator[None]:
    """`serve` with this machine as its node of `slots` slots, until the block ends."""
    from reconciler.controller.nodes import local_node_name

    node = folder / "node.yaml"
    node.write_text(
        json.dumps(
            {
                "apiVersion": "reconciler.dev/v1alpha1",
                "kind": "Node",
                "metadata": {"name": local_node_name()},
                "spec": {"capacity": {"slots": slots}},
            }
        )
        + "\n"
    )
    _apply(url, node, env)
    proc = subprocess.Popen(
        [PYTHON, "-m", "reconciler", "--store", url, "serve", "--port", str(_free_port())],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "serve.log").open("w"),
        start_new_session=True,
        env=env,
    )
    try:
        _wait_ready_nodes(url, 1)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def embedded(jobs: int, links: int) -> tuple[float, float]:
    """The reference: `serve` with this machine as a node of 6 slots; (seconds for the jobs,
    seconds a link of the chain)."""
    with scratch("sqlite", "reconciler-bench-agents-") as (url, folder), local_serve(url, folder, AGENTS * SLOTS):
        took = _timed(url, folder, jobs, "embedded")[0]
        return took, per_link(url, folder, links, jobs)


def remote(jobs: int, links: int) -> tuple[float, list[float], float, bool]:
    with scratch("sqlite", "reconciler-bench-agents-") as (url, folder):
        cluster = Cluster(url, folder)
        try:
            cluster.start()
            took, latencies = _timed(url, folder, jobs, "agents")
            return took, latencies, per_link(url, folder, links, jobs), cluster.isolated
        finally:
            cluster.close()


def rows(jobs: int) -> list[Row]:
    links = max(10, jobs // 5)
    log(f"agents: {jobs} jobs of sleep 0.05, then a {links}-job chain, on the embedded controller (6 slots)")
    base, base_link = embedded(jobs, links)
    log(f"agents: the same over {AGENTS} agents of {SLOTS} slots")
    took, latencies, link, isolated = remote(jobs, links)
    where = "3 network namespaces" if isolated else "loopback (no network namespaces here)"
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p95 = latencies[int(0.95 * (len(latencies) - 1))] * 1000
    return [
        Row(
            "18 remote agents, throughput (sqlite)",
            f"{jobs / took:.1f} jobs/s over {AGENTS} agents x {SLOTS} slots ({where}), {took:.1f} s",
            f"embedded controller, 6 slots: {jobs / base:.1f} jobs/s, {base:.1f} s",
            took / base,
            "x",
            1.25,  # at least 80% of the embedded throughput
            [f"18: agents reach {100 * base / took:.0f}% of the embedded controller's throughput ({where})"],
        ),
        Row(
            "18 remote agents, placement to start (sqlite)",
            f"p50 {p50:.1f} ms, p95 {p95:.1f} ms over {len(latencies)} runs",
            "admission (Admitted event) to the agent's process start",
            p50,
            "ms",
            50.0,
        ),
        Row(
            "18 remote agents, chain per link (sqlite)",
            f"{link * 1000:.1f} ms a link of a {links}-job chain of /bin/true over {AGENTS} agents ({where})",
            f"embedded controller: {base_link * 1000:.1f} ms a link",
            link / base_link,
            "x",
            None,
            [
                "18: a link over the agents is a run's end reported, its job completed, the next job admitted "
                "and placed, its agent's long poll answered and the run started; (chain - one job) / (links - 1)"
            ],
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    for row in rows(args.jobs):
        print(row)


if __name__ == "__main__":
    main()
