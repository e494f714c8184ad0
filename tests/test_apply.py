"""apply / diff / get / delete semantics through the CLI (API.md sections 1 and 3).

Tests of store behaviour (transactions, compare-and-swap, generations, deletes) run on SQLite
and PostgreSQL (`store_url`); rendering and validation run on SQLite. The CLI runs
in-process through its real entry point (tests/data/inprocess.py); the few things that
depend on a fresh process (file modes of a new store) use a real subprocess."""

from __future__ import annotations

import json
import re
import socket
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.data.inprocess import cli
from tests.data.storedump import dump_store
from tests.helpers import run_cli

API = "reconciler.dev/v1alpha1"
RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3,}Z$")


def doc(
    kind: str,
    name: str,
    spec: dict | None = None,
    *,
    labels: dict | None = None,
    annotations: dict | None = None,
    **meta: Any,
) -> dict:
    metadata: dict[str, Any] = {"name": name, **meta}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": API, "kind": kind, "metadata": metadata, "spec": spec or {}}


def job(name: str, labels: dict | None = None, **spec: Any) -> dict:
    return doc("Job", name, {"command": ["true"], **spec}, labels=labels)


def pool(name: str, slots: int | str = 2, **kw) -> dict:
    return doc("Pool", name, {"slots": slots}, **kw)


def write(path: Path, *docs: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def ok(*args: str, store: str, input: str | None = None):
    result = cli(*args, store=store, input=input)
    assert result.code == 0, f"{args} -> exit {result.code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def get_json(store: str, kind: str, *names: str) -> dict:
    return json.loads(ok("get", kind, *names, "-o", "json", store=store).stdout)


def names_of(store: str, kind: str, *args: str) -> list[str]:
    """`get KIND ARGS -o name`, without the `kind.reconciler.dev/` prefix."""
    out = ok("get", kind, *args, "-o", "name", store=store).stdout
    return [line.split("/", 1)[1] for line in out.splitlines()]


def lines(text: str) -> list[str]:
    return text.splitlines()


# --- created / configured / unchanged ------------------------------------------------------


def test_created_configured_unchanged(store_url, tmp_path):
    f = tmp_path / "set.yaml"
    write(f, pool("work"), job("a", pool="work"), job("b", dependsOn=["a"]))
    first = ok("apply", "-f", str(f), store=store_url)
    assert lines(first.stdout) == [
        "pool.reconciler.dev/work created",
        "job.reconciler.dev/a created",
        "job.reconciler.dev/b created",
    ]
    assert first.stderr == ""
    again = ok("apply", "-f", str(f), store=store_url)
    assert lines(again.stdout) == [
        "pool.reconciler.dev/work unchanged",
        "job.reconciler.dev/a unchanged",
        "job.reconciler.dev/b unchanged",
    ]
    write(f, pool("work"), job("a", pool="work", priority=5), job("b", dependsOn=["a"]))
    third = ok("apply", "-f", str(f), store=store_url)
    assert lines(third.stdout) == [
        "pool.reconciler.dev/work unchanged",
        "job.reconciler.dev/a configured",
        "job.reconciler.dev/b unchanged",
    ]
    assert get_json(store_url, "job", "a")["spec"]["priority"] == 5


def test_generation_bumps_only_on_spec_change(store_url, tmp_path):
    f = tmp_path / "j.yaml"
    write(f, job("g", labels={"team": "a"}))
    ok("apply", "-f", str(f), store=store_url)
    first = get_json(store_url, "job", "g")["metadata"]
    assert first["generation"] == 1

    write(f, job("g", labels={"team": "b"}))  # labels only
    assert lines(ok("apply", "-f", str(f), store=store_url).stdout) == ["job.reconciler.dev/g configured"]
    relabelled = get_json(store_url, "job", "g")["metadata"]
    assert relabelled["generation"] == 1
    assert relabelled["labels"] == {"team": "b"}
    assert int(relabelled["resourceVersion"]) > int(first["resourceVersion"])

    write(f, doc("Job", "g", {"command": ["true"]}, labels={"team": "b"}, annotations={"note": "hi"}))
    ok("apply", "-f", str(f), store=store_url)
    annotated = get_json(store_url, "job", "g")["metadata"]
    assert annotated["generation"] == 1
    assert annotated["annotations"]["note"] == "hi"
    assert int(annotated["resourceVersion"]) > int(relabelled["resourceVersion"])

    write(f, doc("Job", "g", {"command": ["false"]}, labels={"team": "b"}, annotations={"note": "hi"}))
    ok("apply", "-f", str(f), store=store_url)
    respecced = get_json(store_url, "job", "g")["metadata"]
    assert respecced["generation"] == 2
    assert int(respecced["resourceVersion"]) > int(annotated["resourceVersion"])
    # identity and creation time survive every update
    assert respecced["uid"] == first["uid"]
    assert respecced["creationTimestamp"] == first["creationTimestamp"]

    assert lines(ok("apply", "-f", str(f), store=store_url).stdout) == ["job.reconciler.dev/g unchanged"]
    assert get_json(store_url, "job", "g")["metadata"] == respecced


def test_equivalent_spellings_are_unchanged(sqlite_url, tmp_path):
    """Quantities and shorthands are stored canonically: another spelling of the same spec
    is `unchanged` and does not bump generation."""
    f = tmp_path / "j.yaml"
    write(
        f,
        job("base"),
        job(
            "s",
            dependsOn=["base"],
            timeout="60m",
            resources={"memory": "1024Mi", "cpu": "500m"},
            retry={"limit": 1, "backoff": {"delay": "1000ms"}},
        ),
    )
    ok("apply", "-f", str(f), store=sqlite_url)
    before = get_json(sqlite_url, "job", "s")
    write(
        f,
        job("base"),
        job(
            "s",
            dependsOn=[{"job": "base", "outcomes": ["Succeeded"]}],
            timeout="1h",
            resources={"memory": "1Gi", "cpu": 0.5},
            retry={"limit": 1, "backoff": {"delay": "1s"}},
        ),
    )
    assert lines(ok("apply", "-f", str(f), store=sqlite_url).stdout) == [
        "job.reconciler.dev/base unchanged",
        "job.reconciler.dev/s unchanged",
    ]
    assert get_json(sqlite_url, "job", "s")["metadata"] == before["metadata"]
    assert before["spec"]["timeout"] == "1h" and before["spec"]["resources"]["memory"] == "1Gi"


def test_new_job_starts_waiting_with_system_metadata(sqlite_url, tmp_path):
    f = write(tmp_path / "j.yaml", job("w"))
    ok("apply", "-f", f, store=sqlite_url)
    obj = get_json(sqlite_url, "jobs", "w")
    assert obj["apiVersion"] == API and obj["kind"] == "Job"
    meta = obj["metadata"]
    assert meta["uid"] and meta["generation"] == 1 and meta["resourceVersion"]
    assert RFC3339_MS.match(meta["creationTimestamp"]), meta["creationTimestamp"]
    assert obj["status"]["phase"] == "Waiting"
    assert obj["spec"]["workingDir"] == str(tmp_path)  # relative to the manifest's folder, stored absolute


# --- dry run, output shapes, diff ----------------------------------------------------------


def test_dry_run_stores_nothing(store_url, tmp_path):
    base = write(tmp_path / "base.yaml", pool("p"), job("a", pool="p"))
    ok("apply", "-f", base, store=store_url)
    before = dump_store(store_url)
    f = write(tmp_path / "next.yaml", pool("p", slots=3), job("a", pool="p"), job("new"))
    result = ok("apply", "--dry-run", "-f", f, store=store_url)
    assert lines(result.stdout) == [
        "pool.reconciler.dev/p configured (dry run)",
        "job.reconciler.dev/a unchanged (dry run)",
        "job.reconciler.dev/new created (dry run)",
    ]
    assert dump_store(store_url) == before
    assert cli("get", "job", "new", store=store_url).code == 3
    assert get_json(store_url, "pool", "p")["spec"]["slots"] == 2


def test_dry_run_with_prune_deletes_nothing(store_url, tmp_path):
    ok("apply", "-f", write(tmp_path / "all.yaml", job("a"), job("b")), store=store_url)
    before = dump_store(store_url)
    result = ok("apply", "--dry-run", "--prune", "-f", write(tmp_path / "one.yaml", job("a")), store=store_url)
    assert "job.reconciler.dev/b pruned (dry run)" in lines(result.stdout)
    assert dump_store(store_url) == before


def test_output_name(sqlite_url, tmp_path):
    f = write(tmp_path / "s.yaml", pool("p"), job("a", pool="p"))
    result = ok("apply", "-f", f, "-o", "name", store=sqlite_url)
    assert lines(result.stdout) == ["pool.reconciler.dev/p", "job.reconciler.dev/a"]
    assert lines(ok("apply", "-f", f, "-o", "name", store=sqlite_url).stdout) == lines(result.stdout)
    assert lines(ok("get", "jobs", "-o", "name", store=sqlite_url).stdout) == ["job.reconciler.dev/a"]


def test_output_json(sqlite_url, tmp_path):
    f = write(tmp_path / "s.yaml", pool("p"), job("a", pool="p", labels={"x": "y"}))
    result = ok("apply", "-f", f, "-o", "json", store=sqlite_url)
    payload = json.loads(result.stdout)
    assert set(payload) == {"apiVersion", "kind", "items"}
    assert payload["apiVersion"] == "v1" and payload["kind"] == "List"
    assert [(i["kind"], i["metadata"]["name"]) for i in payload["items"]] == [("Pool", "p"), ("Job", "a")]
    for item in payload["items"]:
        assert item["apiVersion"] == API
        assert {"name", "uid", "generation", "resourceVersion", "creationTimestamp"} <= set(item["metadata"])
    assert payload["items"][1]["metadata"]["labels"] == {"x": "y"}
    assert payload["items"][1]["spec"]["pool"] == "p"
    assert payload["items"][1]["status"]["phase"] == "Waiting"
    # what apply printed is what get returns
    assert payload["items"][1] == get_json(sqlite_url, "job", "a")
    # a single object by name is the object itself, several are a List
    assert get_json(sqlite_url, "jobs", "a")["kind"] == "Job"
    assert get_json(sqlite_url, "jobs")["kind"] == "List"
    # an unchanged apply prints the stored objects too
    assert json.loads(ok("apply", "-f", f, "-o", "json", store=sqlite_url).stdout) == payload
    # one object applied is printed as itself, as kubectl prints it
    one = write(tmp_path / "one.yaml", job("a", pool="p", labels={"x": "y"}))
    assert json.loads(ok("apply", "-f", one, "-o", "json", store=sqlite_url).stdout) == payload["items"][1]


def test_what_get_prints_as_a_list_applies_back(sqlite_url, tmp_path):
    """As kubectl applies a List: `get -o yaml|json` of several objects is a file that apply
    takes item by item (unchanged here), and a bad item is named by its own line and field."""
    ok("apply", "-f", write(tmp_path / "s.yaml", pool("p"), job("a", pool="p"), job("b")), store=sqlite_url)
    for fmt in ("yaml", "json"):
        listing = tmp_path / f"all.{fmt}"
        listing.write_text(ok("get", "jobs,pools", "-o", fmt, store=sqlite_url).stdout)
        result = ok("apply", "-f", str(listing), store=sqlite_url)
        assert sorted(lines(result.stdout)) == [
            "job.reconciler.dev/a unchanged",
            "job.reconciler.dev/b unchanged",
            "pool.reconciler.dev/p unchanged",
        ], result
    before = dump_store(sqlite_url)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        f"- apiVersion: {API}\n  kind: Job\n  metadata: {{name: c}}\n  spec: {{command: ['true']}}\n"
        f"- apiVersion: {API}\n  kind: Job\n  metadata: {{name: d}}\n  spec:\n    command: ['true']\n    slots: many\n"
    )
    result = cli("apply", "-f", str(bad), store=sqlite_url)
    assert result.code == 2 and f"{bad}:13: spec.slots" in result.stderr, result.stderr
    assert dump_store(sqlite_url) == before


def test_a_list_larger_than_one_documents_limit_applies_item_by_item(sqlite_url, tmp_path, monkeypatch):
    """The node limit (against alias bombs) is a document's: a List's is each item's, so a
    List of many jobs, as `get -o yaml` prints a store's, applies whole."""
    from reconciler import manifests, yamldoc

    for module in (manifests, yamldoc):
        monkeypatch.setattr(module, "MAX_NODES", 200)  # the whole List is about 20 nodes a job
    items = [job(f"j{i}") for i in range(40)]
    listing = tmp_path / "list.yaml"
    listing.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False))
    from reconciler.manifests import read

    loaded = read([str(listing)])
    assert loaded.problems == [] and [m.name for m in loaded.manifests] == [f"j{i}" for i in range(40)]
    assert loaded.manifests[7].line == 1 + 7 * (len(yaml.safe_dump(items[0]).splitlines())) + 3
    # the same jobs in one mapping that is no List: still one document over the limit
    lump = tmp_path / "lump.yaml"
    lump.write_text(yaml.safe_dump({"apiVersion": API, "kind": "Job", "items": items}, sort_keys=False))
    assert "document too large" in " ".join(read([str(lump)]).problems)


def test_apply_refuses_unknown_output(sqlite_url, tmp_path):
    f = write(tmp_path / "s.yaml", job("a"))
    result = cli("apply", "-f", f, "-o", "yaml", store=sqlite_url)
    assert result.code == 2 and result.stdout == ""
    assert cli("get", "job", "a", store=sqlite_url).code == 3


def test_diff(store_url, tmp_path):
    f = tmp_path / "d.yaml"
    write(f, job("a", labels={"v": "1"}))
    new = cli("diff", "-f", str(f), store=store_url)  # not stored yet: everything is new
    assert new.code == 1 and "Traceback" not in new.stderr
    assert "+++ applied/job.reconciler.dev/a" in new.stdout and "+kind: Job" in new.stdout
    assert cli("get", "job", "a", store=store_url).code == 3

    ok("apply", "-f", str(f), store=store_url)
    same = cli("diff", "-f", str(f), store=store_url)
    assert (same.code, same.stdout) == (0, "")

    write(f, doc("Job", "a", {"command": ["false"]}, labels={"v": "2"}))
    before = dump_store(store_url)
    changed = cli("diff", "-f", str(f), store=store_url)
    assert changed.code == 1
    out = changed.stdout
    assert out.startswith("--- live/job.reconciler.dev/a\n+++ applied/job.reconciler.dev/a\n"), out
    assert re.search(r"^@@ .* @@", out, re.MULTILINE)
    assert re.search(r"^-\s+v: '1'$", out, re.MULTILINE) and re.search(r"^\+\s+v: '2'$", out, re.MULTILINE)
    assert re.search(r"^-\s+- 'true'$", out, re.MULTILINE) and re.search(r"^\+\s+- 'false'$", out, re.MULTILINE)
    assert "resourceVersion" not in out and "uid" not in out  # system fields are not a difference
    assert dump_store(store_url) == before


def test_diff_of_one_changed_field_is_one_line_each_way(store_url, tmp_path):
    """Live and applied are printed in one canonical order, so a change shows as itself,
    not as fields that merely moved."""
    f = write(tmp_path / "d.yaml", job("a", retry={"limit": 1, "backoff": {"delay": "2s"}}, priority=1))
    ok("apply", "-f", f, store=store_url)
    write(tmp_path / "d.yaml", job("a", retry={"limit": 1, "backoff": {"delay": "3s"}}, priority=1))
    out = cli("diff", "-f", f, store=store_url).stdout
    changed = [line for line in out.splitlines() if line[:1] in "+-" and line[:3] not in ("---", "+++")]
    assert changed == ["-      delay: 2s", "+      delay: 3s"], out


def test_an_unreachable_server_is_exit_1_naming_it_never_the_local_store(sqlite_url, tmp_path):
    """--server used to be ignored (the verb acted on the local store): now a server that
    does not answer is an error naming its address, and the local store is left alone."""
    before = dump_store(sqlite_url) if Path(sqlite_url.removeprefix("sqlite:///")).exists() else None
    manifest = write(tmp_path / "a.yaml", job("x"))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    result = run_cli("--server", url, "apply", "-f", manifest, store=sqlite_url)
    assert result.code == 1 and result.stdout == "", result
    assert f"error: cannot reach the server at {url}" in result.stderr, result.stderr
    if before is not None:
        assert dump_store(sqlite_url) == before
    env_result = run_cli("get", "jobs", store=sqlite_url, env={"RECONCILER_SERVER": url})
    assert env_result.code == 1 and url in env_result.stderr
    bad = run_cli("get", "jobs", store=sqlite_url, env={"RECONCILER_SERVER": "127.0.0.1:9001"})
    assert bad.code == 2 and "use http://HOST:PORT" in bad.stderr
    both = cli("--server", url, "get", "jobs", store=sqlite_url)  # cli() gives --store too
    assert both.code == 2 and "give --store or --server, not both" in both.stderr


# --- prune ---------------------------------------------------------------------------------


def test_prune(store_url, tmp_path):
    everything = write(
        tmp_path / "all.yaml",
        pool("p"),
        job("keep", pool="p"),
        job("x1", labels={"team": "x"}),
        job("y1", labels={"team": "y"}),
        job("x2", labels={"team": "x"}),
    )
    ok("apply", "-f", everything, store=store_url)
    subset = write(tmp_path / "subset.yaml", pool("p"), job("keep", pool="p"))

    only_x = ok("apply", "--prune", "-l", "team=x", "-f", subset, store=store_url)
    # -l limits both what is applied (p and keep do not match) and what is pruned
    assert sorted(lines(only_x.stdout)) == ["job.reconciler.dev/x1 pruned", "job.reconciler.dev/x2 pruned"]
    assert names_of(store_url, "jobs") == ["keep", "y1"]

    rest = ok("apply", "--prune", "-f", subset, store=store_url)
    assert "job.reconciler.dev/y1 pruned" in lines(rest.stdout)
    assert names_of(store_url, "jobs") == ["keep"]
    assert names_of(store_url, "pools") == ["p"]
    # without --prune nothing is ever deleted
    ok("apply", "-f", write(tmp_path / "other.yaml", job("other")), store=store_url)
    assert names_of(store_url, "jobs") == ["keep", "other"]


def test_apply_with_a_selector_applies_only_the_objects_it_matches(store_url, tmp_path):
    """As kubectl's `apply -l`: the objects of the files that do not match are left alone."""
    files = write(tmp_path / "two.yaml", job("yes", labels={"t": "a"}), job("no", labels={"t": "b"}))
    result = ok("apply", "-l", "t=a", "-f", files, store=store_url)
    assert lines(result.stdout) == ["job.reconciler.dev/yes created"]
    assert names_of(store_url, "jobs") == ["yes"]
    before = dump_store(store_url)
    nothing = cli("apply", "-l", "t=typo", "-f", files, store=store_url)
    assert nothing.code == 2 and "match the label selector" in nothing.stderr, nothing
    assert dump_store(store_url) == before


def test_prune_leaves_what_apply_did_not_make(store_url, tmp_path):
    """The node a controller registered for its host (managed by its agent) and a job
    made by `run` are never pruned: only objects whose managed-by says apply."""
    from reconciler.controller.nodes import heartbeat
    from reconciler.store import Store

    store = Store(store_url)
    try:
        heartbeat(store, "this-host", "test:1:0", 1_800_000_000.0)  # what a controller does on start
    finally:
        store.dispose()
    ok("run", "--name", "one-off", "--", "true", store=store_url)
    ok("apply", "-f", write(tmp_path / "a.yaml", job("managed"), job("kept")), store=store_url)
    result = ok("apply", "--prune", "-f", write(tmp_path / "b.yaml", job("kept")), store=store_url)
    assert sorted(lines(result.stdout)) == ["job.reconciler.dev/kept unchanged", "job.reconciler.dev/managed pruned"]
    assert names_of(store_url, "jobs") == ["kept", "one-off"]
    assert names_of(store_url, "nodes") == ["this-host"]


def test_a_registered_node_configured_by_apply_keeps_its_hostname_and_is_never_pruned(store_url, tmp_path):
    """A manifest for the host's node (labels, capacity) configures it; the label its agent
    set stays (the system's, as its annotations are), and a later prune leaves it."""
    from reconciler.controller.nodes import heartbeat
    from reconciler.store import Store

    store = Store(store_url)
    try:
        heartbeat(store, "this-host", "test:1:0", 1_800_000_000.0)
    finally:
        store.dispose()
    node = doc("Node", "this-host", {"capacity": {"slots": 10}}, labels={"gpu": "true", "zone": "a"})
    ok("apply", "-f", write(tmp_path / "node.yaml", node), store=store_url)
    labels = get_json(store_url, "node", "this-host")["metadata"]["labels"]
    assert labels == {"gpu": "true", "zone": "a", "reconciler.dev/hostname": socket.gethostname()[:63]}
    again = ok("apply", "-f", write(tmp_path / "node.yaml", node), store=store_url)
    assert lines(again.stdout) == ["node.reconciler.dev/this-host unchanged"]
    result = ok(
        "apply",
        "--prune",
        "-l",
        "zone=a",
        "-f",
        write(tmp_path / "p.yaml", pool("p", labels={"zone": "a"})),
        store=store_url,
    )
    assert "this-host" not in result.stdout
    assert names_of(store_url, "nodes") == ["this-host"]
    assert get_json(store_url, "node", "this-host")["spec"]["capacity"]["slots"] == 10


def test_a_pool_may_be_lowered_below_finished_jobs_and_paused_at_zero(store_url, tmp_path):
    """Only jobs that may still wait for a slot hold a pool's size up: a Completed one does
    not, and 0 slots pauses the pool (every job waits until it is raised)."""
    ok("up", "-f", write(tmp_path / "done.yaml", pool("p", 2), job("big", pool="p", slots=2)), store=store_url)
    assert get_json(store_url, "job", "big")["status"]["phase"] == "Completed"
    ok("apply", "-f", write(tmp_path / "p1.yaml", pool("p", 1)), store=store_url)
    stranded = cli("rerun", "job/big", store=store_url)  # queued again, it would wait for ever
    assert stranded.code == 4 and "needs 2 slots and pool 'p' has 1: raise the pool" in stranded.stderr
    ok("apply", "-f", write(tmp_path / "w.yaml", job("waiting", pool="p", slots=1, suspend=True)), store=store_url)
    ok("apply", "-f", write(tmp_path / "p0.yaml", pool("p", 0)), store=store_url)
    # paused: a job may still be applied to it, and waits
    ok("apply", "-f", write(tmp_path / "w3.yaml", job("later", pool="p", slots=2, suspend=True)), store=store_url)
    refused = cli("apply", "-f", write(tmp_path / "p1.yaml", pool("p", 1)), store=store_url)
    assert refused.code == 2 and "1 slots is less than job 'later' needs (2)" in refused.stderr  # raised from 0 too
    ok("apply", "-f", write(tmp_path / "p2.yaml", pool("p", 2)), store=store_url)
    ok("apply", "-f", write(tmp_path / "w2.yaml", job("waiting", pool="p", slots=2, suspend=True)), store=store_url)
    refused = cli("apply", "-f", write(tmp_path / "p1.yaml", pool("p", 1)), store=store_url)
    assert refused.code == 2 and "1 slots is less than job 'later' needs (2)" in refused.stderr  # first by name
    assert get_json(store_url, "pool", "p")["spec"]["slots"] == 2


def test_deleting_a_pool_in_use_counts_the_jobs_it_does_not_name(sqlite_url, tmp_path):
    jobs = [job(f"user-{i}", pool="p", suspend=True) for i in range(7)]
    ok("apply", "-f", write(tmp_path / "a.yaml", pool("p", 1), *jobs), store=sqlite_url)
    refused = cli("delete", "pool", "p", store=sqlite_url)
    assert refused.code == 4
    assert "used by job(s) user-0, user-1, user-2, user-3, user-4 and 2 more" in refused.stderr


def test_prune_removes_a_pool_together_with_its_jobs(sqlite_url, tmp_path):
    ok("apply", "-f", write(tmp_path / "a.yaml", pool("gone"), job("user", pool="gone"), job("stay")), store=sqlite_url)
    result = ok("apply", "--prune", "-f", write(tmp_path / "b.yaml", job("stay")), store=sqlite_url)
    assert sorted(lines(result.stdout)) == [
        "job.reconciler.dev/stay unchanged",
        "job.reconciler.dev/user pruned",
        "pool.reconciler.dev/gone pruned",
    ]
    assert names_of(sqlite_url, "pools") == []


def test_prune_that_would_leave_a_kept_job_naming_a_pruned_one_is_refused(store_url, tmp_path):
    """The store --prune leaves is checked as an apply's: a kept job depending on a pruned
    job, or in a pruned pool, is refused, naming the file, line and field, and nothing changes
    (stored, the folder could not be applied again, and the job would end Aborted)."""
    folder = tmp_path / "folder"
    write(folder / "a.yaml", pool("p"), job("base"))
    write(folder / "b.yaml", job("after", dependsOn=["base"], pool="p"))
    ok("apply", "-f", str(folder), store=store_url)
    (folder / "a.yaml").unlink()
    before = dump_store(store_url)

    result = cli("apply", "--prune", "-f", str(folder), store=store_url)
    assert result.code == 2, result
    assert f"{folder / 'b.yaml'}:" in result.stderr
    assert (
        "spec.dependsOn[0].job: job 'base' does not exist (--prune would delete it: it is in none of the files applied)"
    ) in result.stderr
    assert "spec.pool: pool 'p' does not exist (--prune would delete it" in result.stderr
    assert dump_store(store_url) == before
    # pruning only what no kept job needs goes through
    ok("apply", "--prune", "-l", "nothing=here", "-f", str(folder), store=store_url)
    assert names_of(store_url, "jobs") == ["after", "base"]


def test_prune_lets_a_pool_shrink_below_a_job_it_deletes(store_url, tmp_path):
    ok("apply", "-f", write(tmp_path / "a.yaml", pool("p", 4), job("big", pool="p", slots=4)), store=store_url)
    result = ok("apply", "--prune", "-f", write(tmp_path / "b.yaml", pool("p", 2)), store=store_url)
    assert sorted(lines(result.stdout)) == ["job.reconciler.dev/big pruned", "pool.reconciler.dev/p configured"]


# --- optimistic concurrency ----------------------------------------------------------------


def test_stale_resource_version_is_a_conflict(store_url, tmp_path):
    ok("apply", "-f", write(tmp_path / "a.yaml", job("other"), job("c", labels={"n": "1"})), store=store_url)
    old_rv = get_json(store_url, "job", "c")["metadata"]["resourceVersion"]
    ok("apply", "-f", write(tmp_path / "b.yaml", job("c", labels={"n": "2"})), store=store_url)
    current_rv = get_json(store_url, "job", "c")["metadata"]["resourceVersion"]
    assert current_rv != old_rv
    before = dump_store(store_url)

    stale = doc("Job", "c", {"command": ["false"]}, labels={"n": "3"}, resourceVersion=old_rv)
    # a valid change to another object in the same apply is not stored either
    result = cli("apply", "-f", write(tmp_path / "stale.yaml", job("other", priority=9), stale), store=store_url)
    assert result.code == 4, result
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert "stale" in result.stderr and old_rv in result.stderr
    assert dump_store(store_url) == before

    fresh = doc("Job", "c", {"command": ["false"]}, labels={"n": "3"}, resourceVersion=current_rv)
    assert lines(ok("apply", "-f", write(tmp_path / "fresh.yaml", fresh), store=store_url).stdout) == [
        "job.reconciler.dev/c configured"
    ]


def test_a_uid_that_is_not_the_stored_objects_is_a_conflict(store_url, tmp_path):
    """As Kubernetes' UID precondition: a manifest carrying the uid of an object since
    deleted and made again must not change the new one."""
    ok("apply", "-f", write(tmp_path / "a.yaml", job("u", labels={"n": "1"})), store=store_url)
    uid = get_json(store_url, "job", "u")["metadata"]["uid"]
    before = dump_store(store_url)
    other = doc("Job", "u", {"command": ["false"]}, labels={"n": "2"}, uid="00000000-0000-0000-0000-000000000000")
    result = cli("apply", "-f", write(tmp_path / "other.yaml", other), store=store_url)
    assert result.code == 4, result
    assert result.stdout == "" and "metadata.uid" in result.stderr and uid in result.stderr
    assert dump_store(store_url) == before
    same = doc("Job", "u", {"command": ["false"]}, labels={"n": "2"}, uid=uid)
    assert lines(ok("apply", "-f", write(tmp_path / "same.yaml", same), store=store_url).stdout) == [
        "job.reconciler.dev/u configured"
    ]


def test_a_precondition_on_a_deleted_object_is_a_conflict_not_a_creation(store_url, tmp_path):
    """A manifest read from an object (get -o yaml) carries its resourceVersion and uid; once
    the object is deleted, applying that copy must not make it again (exit 4, nothing stored)."""
    ok("apply", "-f", write(tmp_path / "a.yaml", job("d")), store=store_url)
    read = get_json(store_url, "job", "d")["metadata"]
    ok("delete", "job", "d", store=store_url)
    before = dump_store(store_url)
    for field in ("resourceVersion", "uid"):
        copy = doc("Job", "d", {"command": ["true"]}, **{field: read[field]})
        result = cli("apply", "-f", write(tmp_path / f"{field}.yaml", copy), store=store_url)
        assert result.code == 4, result
        assert f"metadata.{field}" in result.stderr and "deleted since the manifest was read" in result.stderr
        assert dump_store(store_url) == before


# --- get -----------------------------------------------------------------------------------

SELECTOR_CASES = [
    ("tier=web", ["s-a", "s-c"]),
    ("tier==web", ["s-a", "s-c"]),
    ("tier!=web", ["s-b", "s-d"]),  # as in Kubernetes: objects without the key match !=
    ("tier in (web,db)", ["s-a", "s-b", "s-c"]),
    ("tier in (cache)", []),
    ("tier notin (web)", ["s-b", "s-d"]),
    ("canary", ["s-c"]),
    ("!canary", ["s-a", "s-b", "s-d"]),
    ("tier=web,env=prod", ["s-a"]),
    ("env in (prod, dev),!canary", ["s-a", "s-b"]),
    ("example.com/owner=me", ["s-d"]),
]


@pytest.fixture(scope="module")
def labelled_store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("selectors")
    url = f"sqlite:///{root / 'state' / 'state.db'}"
    f = write(
        root / "s.yaml",
        job("s-a", {"tier": "web", "env": "prod"}),
        job("s-b", {"tier": "db", "env": "prod"}),
        job("s-c", {"tier": "web", "env": "dev", "canary": "true"}),
        job("s-d", {"example.com/owner": "me"}),
        pool("sp", labels={"tier": "web"}),
    )
    ok("apply", "-f", f, store=url)
    return url


@pytest.mark.parametrize("selector,expected", SELECTOR_CASES, ids=[s for s, _ in SELECTOR_CASES])
def test_get_with_selector(labelled_store, selector, expected):
    assert names_of(labelled_store, "jobs", "-l", selector) == expected
    as_json = get_json(labelled_store, "jobs", "-l", selector)
    assert [i["metadata"]["name"] for i in as_json["items"]] == expected


def test_get_selector_applies_per_kind(labelled_store):
    assert names_of(labelled_store, "pools", "-l", "tier=web") == ["sp"]


def test_get_invalid_selector(labelled_store):
    result = cli("get", "jobs", "-l", "tier in (web", store=labelled_store)
    assert result.code == 2 and result.stdout == "" and "selector" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("word", ["jobs", "job", "jb", "JOBS", "job.reconciler.dev", "jobs.reconciler.dev"])
def test_get_kind_names(labelled_store, word):
    assert names_of(labelled_store, word) == ["s-a", "s-b", "s-c", "s-d"]


@pytest.mark.parametrize("word", ["pools", "pool", "pl"])
def test_get_pool_kind_names(labelled_store, word):
    assert names_of(labelled_store, word) == ["sp"]


@pytest.mark.parametrize("word", ["nodes", "node", "no", "notifiers", "notifier", "nf"])
def test_get_other_kind_names(labelled_store, word):
    result = ok("get", word, "-o", "json", store=labelled_store)
    assert json.loads(result.stdout) == {"apiVersion": "v1", "kind": "List", "items": []}


def test_get_unknown_kind(labelled_store):
    result = cli("get", "deployments", store=labelled_store)
    assert result.code == 2 and result.stdout == "" and "deployments" in result.stderr


def test_get_table(labelled_store):
    out = ok("get", "jobs", store=labelled_store).stdout
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "STATUS", "POOL", "NODE", "ATTEMPTS", "AGE"]
    assert [r.split()[0] for r in rows] == ["s-a", "s-b", "s-c", "s-d"]
    assert all(r.split()[1] == "Waiting" for r in rows)
    assert ok("get", "jobs", "-o", "wide", store=labelled_store).stdout.splitlines()[0].split()[:7] == [
        "NAME",
        "STATUS",
        "POOL",
        "NODE",
        "ATTEMPTS",
        "AGE",
        "REVISION",
    ]


def test_get_missing_name_exits_3(labelled_store):
    result = cli("get", "job", "nope", store=labelled_store)
    assert result.code == 3 and result.stdout == "" and "nope" in result.stderr
    both = cli("get", "jobs", "s-a", "nope", store=labelled_store)
    assert both.code == 3 and "nope" in both.stderr and "Traceback" not in both.stderr


def test_get_yaml(labelled_store):
    one = yaml.safe_load(ok("get", "job", "s-a", "-o", "yaml", store=labelled_store).stdout)
    assert one["kind"] == "Job" and one["metadata"]["labels"] == {"tier": "web", "env": "prod"}


def test_get_events_times_are_rfc3339(sqlite_url, tmp_path):
    """API.md: times in machine output are RFC 3339 UTC with at least millisecond precision."""
    ok("apply", "-f", write(tmp_path / "e.yaml", job("ev")), store=sqlite_url)
    events = get_json(sqlite_url, "events")
    assert events["kind"] == "List" and events["items"]
    created = [e for e in events["items"] if e["involvedObject"]["name"] == "ev"]
    assert [e["reason"] for e in created] == ["Created"]
    # Kubernetes' Event shape: apiVersion, kind, metadata (named NAME.HEX, as Kubernetes does)
    [event] = created
    assert (event["apiVersion"], event["kind"]) == ("v1", "Event")
    assert event["metadata"]["name"].startswith("ev.") and int(event["metadata"]["name"][3:], 16) > 0
    assert event["metadata"]["creationTimestamp"] == event["lastTimestamp"]
    for event in events["items"]:
        stamps = {k: v for k, v in event.items() if k.lower().endswith(("timestamp", "time"))}
        assert stamps, event
        for key, value in stamps.items():
            assert RFC3339_MS.match(value), f"{key}: {value!r} is not RFC 3339 UTC with milliseconds"
            datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- delete --------------------------------------------------------------------------------


def test_delete_by_name_ref_file_and_selector(store_url, tmp_path):
    f = write(
        tmp_path / "all.yaml",
        job("d1"),
        job("d2"),
        job("d3", {"grp": "x"}),
        job("d4", {"grp": "x"}),
        job("d5", {"grp": "y"}),
    )
    g = write(tmp_path / "more.yaml", job("d6"), pool("dp"))
    ok("apply", "-f", f, "-f", g, store=store_url)

    assert lines(ok("delete", "job", "d1", store=store_url).stdout) == ["job.reconciler.dev/d1 deleted"]
    assert lines(ok("delete", "job/d2", store=store_url).stdout) == ["job.reconciler.dev/d2 deleted"]
    assert sorted(lines(ok("delete", "jobs", "-l", "grp=x", store=store_url).stdout)) == [
        "job.reconciler.dev/d3 deleted",
        "job.reconciler.dev/d4 deleted",
    ]
    assert names_of(store_url, "jobs") == ["d5", "d6"]
    assert sorted(lines(ok("delete", "-f", g, store=store_url).stdout)) == [
        "job.reconciler.dev/d6 deleted",
        "pool.reconciler.dev/dp deleted",
    ]
    assert names_of(store_url, "jobs") == ["d5"] and names_of(store_url, "pools") == []
    for name in ("d1", "d2", "d3", "d4", "d6"):
        assert cli("get", "job", name, store=store_url).code == 3
    # deletions are recorded as events
    reasons = [(e["involvedObject"]["name"], e["reason"]) for e in get_json(store_url, "events")["items"]]
    assert ("d1", "Deleted") in reasons and ("dp", "Deleted") in reasons


def test_delete_missing_exits_3(sqlite_url, tmp_path):
    ok("apply", "-f", write(tmp_path / "a.yaml", job("here")), store=sqlite_url)
    before = dump_store(sqlite_url)
    result = cli("delete", "job", "ghost", store=sqlite_url)
    assert result.code == 3 and "ghost" in result.stderr and "Traceback" not in result.stderr
    assert dump_store(sqlite_url) == before


def test_delete_needs_a_target(sqlite_url):
    result = cli("delete", "jobs", store=sqlite_url)
    assert result.code == 2 and result.stdout == ""
    assert cli("delete", store=sqlite_url).code == 2


def test_delete_by_selector_alone_takes_every_labelled_kind_but_nodes(store_url, tmp_path):
    """API.md: `delete -l SEL` without a KIND, as kubectl's `delete all -l`: the jobs, pools,
    notifiers and sources that match, in one transaction (jobs before their pools); a node
    is a machine its agent registered, deleted only when its kind is named."""
    f = write(
        tmp_path / "all.yaml",
        pool("px", labels={"grp": "x"}),
        job("jx", {"grp": "x"}, pool="px"),
        job("jy", {"grp": "y"}),
        doc("Notifier", "nf", {"command": ["true"]}, labels={"grp": "x"}),
        doc("Node", "this-host", {"capacity": {"slots": 2}}, labels={"grp": "x"}),
    )
    ok("apply", "-f", f, store=store_url)
    assert sorted(lines(ok("delete", "-l", "grp=x", store=store_url).stdout)) == [
        "job.reconciler.dev/jx deleted",
        "notifier.reconciler.dev/nf deleted",
        "pool.reconciler.dev/px deleted",
    ]
    assert names_of(store_url, "jobs") == ["jy"] and names_of(store_url, "pools") == []
    assert names_of(store_url, "nodes") == ["this-host"]
    # names (or files) and a selector together are refused, not one silently dropped
    both = cli("delete", "job", "jy", "-l", "grp=y", store=store_url)
    assert both.code == 2 and "not both" in both.stderr and names_of(store_url, "jobs") == ["jy"]
    with_file = cli("delete", "-f", f, "-l", "grp=y", store=store_url)
    assert with_file.code == 2 and "not both" in with_file.stderr and names_of(store_url, "jobs") == ["jy"]
    nothing = cli("delete", "-l", "grp=none", store=store_url)
    assert (nothing.code, nothing.stdout, nothing.stderr.strip()) == (0, "", "No resources found.")


def test_delete_pool_in_use_is_a_conflict(store_url, tmp_path):
    ok("apply", "-f", write(tmp_path / "a.yaml", pool("busy"), job("user", pool="busy")), store=store_url)
    before = dump_store(store_url)
    result = cli("delete", "pool", "busy", store=store_url)
    assert result.code == 4, result
    assert result.stdout == "" and "user" in result.stderr and "Traceback" not in result.stderr
    assert dump_store(store_url) == before
    ok("delete", "job", "user", store=store_url)
    assert lines(ok("delete", "pool", "busy", store=store_url).stdout) == ["pool.reconciler.dev/busy deleted"]


def test_delete_file_listing_a_pool_before_its_jobs(sqlite_url, tmp_path):
    """`delete -f` of a file that holds a pool and every job using it removes them all,
    whatever their order in the file (the pool is not in use once the set is gone)."""
    f = write(tmp_path / "a.yaml", pool("pp"), job("pj", pool="pp"))
    ok("apply", "-f", f, store=sqlite_url)
    result = cli("delete", "-f", f, store=sqlite_url)
    assert result.code == 0, result
    assert sorted(lines(result.stdout)) == ["job.reconciler.dev/pj deleted", "pool.reconciler.dev/pp deleted"]
    assert names_of(sqlite_url, "jobs") == [] and names_of(sqlite_url, "pools") == []


# --- the store file and status in manifests ------------------------------------------------


def test_new_store_file_is_private(tmp_path):
    db = tmp_path / "fresh" / "nested" / "state.db"
    result = run_cli("apply", "-f", write(tmp_path / "a.yaml", job("p")), store=f"sqlite:///{db}")
    assert result.code == 0, result.stderr
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    for side in db.parent.iterdir():  # -wal / -shm, when they exist, carry the same mode
        assert stat.S_IMODE(side.stat().st_mode) == 0o600, side


def test_status_in_a_manifest_is_ignored_with_a_warning(sqlite_url, tmp_path):
    manifest = job("st")
    manifest["status"] = {"phase": "Completed", "outcome": "Succeeded", "revision": 7}
    f = write(tmp_path / "st.yaml", manifest)
    result = ok("apply", "-f", f, store=sqlite_url)
    assert lines(result.stdout) == ["job.reconciler.dev/st created"]
    assert re.search(rf"^warning: {re.escape(f)}:\d+: status .*ignored", result.stderr, re.MULTILINE), result.stderr
    status = get_json(sqlite_url, "job", "st")["status"]
    assert status["phase"] == "Waiting" and status["outcome"] is None and status["revision"] == 1
    # re-applying it is still unchanged: status is not part of the desired state
    assert lines(ok("apply", "-f", f, store=sqlite_url).stdout) == ["job.reconciler.dev/st unchanged"]


def test_stdin_apply(sqlite_url):
    text = yaml.safe_dump_all([job("from-stdin")])
    assert lines(ok("apply", "-f", "-", store=sqlite_url, input=text).stdout) == [
        "job.reconciler.dev/from-stdin created"
    ]
    assert names_of(sqlite_url, "jobs") == ["from-stdin"]


def test_subprocess_agrees_with_in_process(tmp_path):
    """The real console script prints the same as the in-process runner used above."""
    f = write(tmp_path / "a.yaml", pool("p"), job("a", pool="p"))
    real = run_cli("apply", "-f", f, store=f"sqlite:///{tmp_path / 'real' / 'state.db'}")
    assert (real.code, real.stdout) == (0, "pool.reconciler.dev/p created\njob.reconciler.dev/a created\n")
    assert real == cli("apply", "-f", f, store=f"sqlite:///{tmp_path / 'inproc' / 'state.db'}")


# --- input that is not a plain file ------------------------------------------------------------


def _bash(command: str, store: str, cwd: Path) -> tuple[int, str, str]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "RECONCILER_STORE": store, "RECONCILER": f"{sys.executable} -m reconciler"}
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, env=env, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def test_a_process_substitution_and_dev_stdin_are_read_as_files(sqlite_url, tmp_path):
    """`apply -f <(cat job.yaml)` and `-f /dev/stdin` used to exit 0 having stored nothing.
    (A stream has no folder: relative working dirs resolve against the current one, which is
    the file's folder here, so both applies store the same spec.)"""
    source = write(tmp_path / "job.yaml", job("piped"), job("stdin-fed"))
    code, out, err = _bash(f"$RECONCILER apply -f <(cat {source})", sqlite_url, tmp_path)
    assert (code, err) == (0, ""), err
    assert lines(out) == ["job.reconciler.dev/piped created", "job.reconciler.dev/stdin-fed created"]
    code, out, err = _bash(f"$RECONCILER apply -f /dev/stdin < {source}", sqlite_url, tmp_path)
    assert (code, lines(out)) == (0, ["job.reconciler.dev/piped unchanged", "job.reconciler.dev/stdin-fed unchanged"])


def test_a_fifo_is_read_as_a_file(sqlite_url, tmp_path):
    import os
    import threading

    fifo = tmp_path / "manifests.fifo"
    os.mkfifo(fifo)
    text = yaml.safe_dump(job("through-a-fifo"))
    writer = threading.Thread(target=lambda: fifo.write_text(text), daemon=True)
    writer.start()
    result = run_cli("apply", "-f", str(fifo), store=sqlite_url)
    writer.join(10)
    assert (result.code, lines(result.stdout)) == (0, ["job.reconciler.dev/through-a-fifo created"]), result


@pytest.mark.parametrize(
    "given", [pytest.param(["-f", "/dev/null"], id="dev-null"), pytest.param(["-f", "-"], id="empty-stdin")]
)
def test_no_objects_at_all_is_invalid_input(sqlite_url, given):
    """As kubectl says: "no objects passed to apply"; an empty desired state is never what
    a user means (with --prune it would delete everything)."""
    result = run_cli("apply", *given, "--prune", store=sqlite_url, input="")
    assert result.code == 2, result
    assert result.stdout == "" and "no objects passed to apply" in result.stderr


def test_a_folder_of_empty_documents_is_invalid_input(sqlite_url, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "empty.yaml").write_text("---\n# nothing here\n---\n")
    result = cli("apply", "-f", str(tmp_path / "m"), store=sqlite_url)
    assert result.code == 2 and "no objects passed to apply" in result.stderr, result


def test_run_takes_a_dependency_as_job_slash_name_as_every_verb_does(sqlite_url):
    ok("run", "--name", "first", "--", "true", store=sqlite_url)
    ok("run", "--name", "other", "--", "true", store=sqlite_url)
    ok(
        "run",
        "--name",
        "second",
        "--after-success",
        "job/first",
        "--after-finish",
        "job/other",
        "--",
        "true",
        store=sqlite_url,
    )
    deps = get_json(sqlite_url, "job", "second")["spec"]["dependsOn"]
    assert [(d["job"], d["outcomes"]) for d in deps] == [("first", ["Succeeded"]), ("other", ["Finished"])]
    refused = cli("run", "--name", "third", "--after-success", "pool/first", "--", "true", store=sqlite_url)
    assert refused.code == 2 and "a one-off job depends on jobs only" in refused.stderr
