"""Remote agents across a real network of namespaces (issue 13 parts 3 and 4): placement over
three agents, pinning, round-robin, an agent's restart, node loss, a partition and its
healing with fencing, the token rules, and logs of a remote run through the server."""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import psutil

from tests.helpers import wait_until
from tests.integration.conftest import epoch
from tests.network.conftest import Net, job


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    live = most = 0
    for _, delta in points:
        live += delta
        most = max(most, live)
    return most


def test_a_dag_spreads_over_three_agents_and_no_node_exceeds_its_slots(net: Net):
    net.start_all()
    roots = [job(f"root-{i}", "sleep 0.4") for i in range(6)]
    middle = [
        job(f"mid-{i}", "sleep 0.3", dependsOn=[{"job": f"root-{i}"}, {"job": f"root-{(i + 1) % 6}"}])
        for i in range(6)
    ]
    final = job("final", "echo done", dependsOn=[{"job": f"mid-{i}"} for i in range(6)])
    net.apply(*roots, *middle, final)
    names = [d["metadata"]["name"] for d in [*roots, *middle, final]]
    done = net.settled(*names)

    assert {n: s["outcome"] for n, s in done.items()} == dict.fromkeys(names, "Succeeded")
    per_node: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for status in done.values():
        (run,) = status["runs"]
        per_node[run["node"]].append((epoch(run["startedAt"]), epoch(run["finishedAt"])))
    assert set(per_node) == {"n1", "n2", "n3"}  # spread: every agent ran some
    for node, intervals in per_node.items():
        assert _max_overlap(intervals) <= 2, f"node {node} ran more than its 2 slots at once"
    for i in range(6):  # a dependent started after both its dependencies ended
        start = epoch(done[f"mid-{i}"]["runs"][0]["startedAt"])
        for dep in (f"root-{i}", f"root-{(i + 1) % 6}"):
            assert start >= epoch(done[dep]["runs"][0]["finishedAt"])
