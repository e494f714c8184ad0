"""spec.placement.strategy: what each job's own field selects at admission, on one store with
several Ready nodes (API.md section 2, Placement).

Nodes are applied as manifests and kept Ready by writing their heartbeats, as their agents
would. A wired Controller whose own node is none of them is driven by hand: admission decides
the node (`status.nodeName`) and the run then waits for that node's agent, which is all these
tests look at. The policy itself (spread, binpack, round-robin) is tested in
tests/controller/test_placement.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from reconciler.api.annotations import MANAGED_BY
from reconciler.api.meta import format_time, utcnow
from reconciler.api.status import new_job_status
from reconciler.apply import apply_manifests
from reconciler.controller.manager import Controller
from reconciler.controller.nodes import heartbeat
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import Store, eventlog
from reconciler.store import repository as repo
from tests.data.inprocess import cli

from .conftest import docs, job_yaml, node_yaml

AGENT = "elsewhere:1:0"  # the nodes' agents: not this process


def apply(store: Store, text: str, tmp_path: Path) -> None:
    manifests, problems = parse_text(text, "placement.yaml", tmp_path)
    assert not problems, problems
    apply_manifests(store, manifests)


def ready(store: Store, *nodes: str) -> None:
    for name in nodes:
        heartbeat(store, name, AGENT, time.time())


def admit(wired: Controller, name: str) -> str | None:
    """Drive the job until admission has decided; the node it was placed on (None: none)."""
    for _ in range(5):
        status = job_statuses(wired.store, [name])[name]
        if status.get("phase") == "Starting" or status.get("reason") == "Unschedulable":
            return status.get("nodeName") if status.get("phase") == "Starting" else None
        wired.jobs(name)
    raise AssertionError(f"{name}: no placement decision: {status}")


def placements(wired: Controller, names: list[str]) -> list[str | None]:
    return [admit(wired, n) for n in names]


def test_each_job_s_strategy_picks_its_node(sqlite_url, tmp_path):
    store = Store(sqlite_url)
    apply(store, docs(node_yaml("a", 4), node_yaml("b", 2), node_yaml("c", 4)), tmp_path)
    ready(store, "a", "b", "c")
    jobs = [
        ("pack-1", "binpack"),  # b: the fewest free slots that fit (2)
        ("spread-1", None),  # a: the most free share (a and c are empty; a by name)
        ("pack-2", "binpack"),  # b again (1 free)
        ("spread-2", "spread"),  # c: empty, where a has 3/4 free
        ("pack-3", "binpack"),  # a: b is full; a has 3 free, c 4
        ("spread-3", None),  # c: 3/4 free against a's 2/4
    ]
    apply(
        store,
        docs(
            *(
                job_yaml(name, "command: ['true']" + (f"\nplacement: {{strategy: {how}}}" if how else ""))
                for name, how in jobs
            )
        ),
        tmp_path,
    )
    wired = Controller(store, node="not-a-node")
    try:
        assert placements(wired, [n for n, _ in jobs]) == ["b", "a", "b", "c", "a", "c"]
        message = [e for e in repo_events(store, "pack-1") if e[0] == "Scheduled"]
        assert message == [("Scheduled", "placed on b (binpack)")]
    finally:
        wired.agent.close()
        store.dispose()


def repo_events(store: Store, name: str) -> list[tuple[str, str]]:
    with store.read() as session:
        return [(e.reason, e.message) for e in eventlog.newest(session, kind="Job", name=name)]


def test_round_robin_rotates_in_name_order_and_its_counter_survives_a_restart(sqlite_url, tmp_path):
    """The turn is store-wide and durable: a new controller (a new process, here a new Store
    and Controller) goes on where the last one stopped. A job of another strategy, or one no
    node can take, uses no turn."""
    store = Store(sqlite_url)
    apply(store, docs(node_yaml("a", 4), node_yaml("b", 4), node_yaml("c", 4)), tmp_path)
    ready(store, "a", "b", "c")
    rr = "command: ['true']\nplacement: {strategy: round-robin}"
    apply(
        store,
        docs(
            job_yaml("rr-1", rr),
            job_yaml("spread", "command: ['true']"),
            job_yaml("rr-2", rr),
            job_yaml("nowhere", "command: ['true']\nplacement: {strategy: round-robin, nodeName: z}"),
            *(job_yaml(f"rr-{i}", rr) for i in (3, 4, 5)),
        ),
        tmp_path,
    )
    wired = Controller(store, node="not-a-node")
    try:
        assert placements(wired, ["rr-1", "spread", "rr-2", "nowhere"]) == ["a", "b", "b", None]
    finally:
        wired.agent.close()
        store.dispose()
    store = Store(sqlite_url)  # the next controller process
    wired = Controller(store, node="not-a-node")
    try:
        assert placements(wired, ["rr-3", "rr-4", "rr-5"]) == ["c", "a", "b"]
    finally:
        wired.agent.close()
        store.dispose()


# what the version before spec.placement.strategy stored for this manifest, byte for byte
OLD_SPEC = (
    '{"command":["true"],"dependsOn":[],"env":{},"placement":{"nodeSelector":{"disk":"ssd"}},"priority":0,'
    '"resources":{"cpu":"1","memory":"512Mi"},"retry":{"backoff":{"delay":"1s","factor":2.0,"jitter":"0s",'
    '"maxDelay":"5m","policy":"exponential"},"limit":0,"onExitCodes":[],"onLost":true,"onTimeout":false},'
    '"slots":1,"stopGracePeriod":"10s","suspend":false,"timeout":"1h","type":"run","workingDir":FOLDER}'
)


def test_a_manifest_stored_before_the_strategy_field_applies_unchanged(sqlite_url, tmp_path):
    """The field is stored only when given: an unchanged manifest applied after the upgrade is
    not a new spec version (no generation bump, so a completed job does not run again)."""
    store = Store(sqlite_url)
    old_spec = OLD_SPEC.replace("FOLDER", json.dumps(str(tmp_path)))  # relative paths resolve against it
    try:
        with store.write() as tx:
            repo.create(
                tx,
                kind="Job",
                name="old",
                spec=json.loads(old_spec),
                labels={},
                annotations={MANAGED_BY: "apply"},
                status=dict(new_job_status(format_time(utcnow()))),
            )
        path = tmp_path / "old.yaml"
        path.write_text(job_yaml("old", "command: ['true']\nplacement: {nodeSelector: {disk: ssd}}"))
        result = cli("apply", "-f", str(path), store=sqlite_url)
        assert (result.code, result.stdout) == (0, "job.reconciler.dev/old unchanged\n"), result.stderr
        with store.read() as session:
            obj = repo.get(session, kind="Job", name="old")
        assert obj is not None and obj.generation == 1 and obj.spec_text == old_spec
        # given, it is stored, and that is a new version
        path.write_text(job_yaml("old", "command: ['true']\nplacement: {nodeSelector: {disk: ssd}, strategy: binpack}"))
        assert cli("apply", "-f", str(path), store=sqlite_url).stdout == "job.reconciler.dev/old configured\n"
        with store.read() as session:
            obj = repo.get(session, kind="Job", name="old")
        assert obj is not None and obj.generation == 2
        assert obj.spec["placement"] == {"nodeSelector": {"disk": "ssd"}, "strategy": "binpack"}
    finally:
        store.dispose()


def test_an_unknown_strategy_is_refused_naming_the_field(sqlite_url, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(job_yaml("bad", "command: ['true']\nplacement: {strategy: random}"))
    result = cli("apply", "-f", str(path), store=sqlite_url)
    assert result.code == 2
    assert "spec.placement.strategy" in result.stderr and "round-robin" in result.stderr, result.stderr
