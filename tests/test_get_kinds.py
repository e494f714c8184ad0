"""`get KIND[,KIND...] [NAME...]` and `get KIND/NAME...`, as kubectl prints several kinds: a
table each with a blank line between them, one List, every name; a name looked up in every
kind. The CLI runs in-process (tests/data/inprocess.py), one call also as a subprocess."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.data.inprocess import cli
from tests.helpers import run_cli
from tests.test_apply import doc, job, ok, pool, write


@pytest.fixture
def store(sqlite_url, tmp_path) -> str:
    manifest = write(
        tmp_path / "objects.yaml",
        pool("batch", 2),
        job("build", labels={"team": "a"}, pool="batch"),
        job("web", labels={"team": "b"}, type="service", port=8080),
        job("batch", labels={"team": "b"}),  # a job and a pool of one name
        doc("Notifier", "chat", {"url": "https://hooks.example/jobs"}),
    )
    ok("apply", "-f", manifest, store=sqlite_url)
    _live(sqlite_url, "web")
    return sqlite_url


def _live(url: str, name: str) -> None:
    """What a controller writes once a service's run started: it is in the registry."""
    from reconciler.store import Store
    from reconciler.store import repository as repo

    store = Store(url)
    try:
        with store.write() as tx:
            obj = repo.get(tx.session, kind="Job", name=name)
            run = {"number": 1, "revision": 1, "node": "n1", "startedAt": "2026-11-30T00:00:00.000Z"}
            repo.update_object(tx, obj, status={"phase": "Running", "nodeName": "n1", "runs": [run]})
    finally:
        store.dispose()


def test_tables_of_several_kinds(store):
    out = ok("get", "jobs,pools", store=store).stdout
    jobs_table, pools_table = out.split("\n\n")
    assert [line.split()[0] for line in jobs_table.splitlines()] == [
        "NAME",
        "job.reconciler.dev/batch",
        "job.reconciler.dev/build",
        "job.reconciler.dev/web",
    ]
    assert jobs_table.splitlines()[0].split() == ["NAME", "STATUS", "POOL", "NODE", "ATTEMPTS", "AGE"]
    assert [line.split()[:2] for line in pools_table.splitlines()] == [
        ["NAME", "SLOTS"],
        ["pool.reconciler.dev/batch", "2"],
    ]
    # in the order asked, each kind once, whatever its spelling; -o wide widens each table
    reversed_order = ok("get", "pl,job,jobs", "-o", "wide", store=store).stdout.split("\n\n")
    assert [t.splitlines()[0].split()[-1] for t in reversed_order] == ["MAX-BYPASS", "MESSAGE"]
    # one kind (or several of which one has anything): the plain table, names unqualified
    assert ok("get", "jobs", store=store).stdout.splitlines()[1].split()[0] == "batch"
    assert ok("get", "jobs,nodes", store=store).stdout.splitlines()[1].split()[0] == "batch"

    # the same through a real process
    def ageless(text: str) -> list[list[str]]:
        return [line.split()[:-1] for line in text.splitlines()]

    assert ageless(run_cli("get", "jobs,pools", store=store).stdout) == ageless(out)


def test_json_yaml_and_names_of_several_kinds(store):
    listing = json.loads(ok("get", "jobs,pools,notifiers", "-o", "json", store=store).stdout)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    assert [(i["kind"], i["metadata"]["name"]) for i in listing["items"]] == [
        ("Job", "batch"),
        ("Job", "build"),
        ("Job", "web"),
        ("Pool", "batch"),
        ("Notifier", "chat"),
    ]
    as_yaml = yaml.safe_load(ok("get", "jobs,pools", "-o", "yaml", store=store).stdout)
    assert [i["kind"] for i in as_yaml["items"]] == ["Job", "Job", "Job", "Pool"]
    # a selector applies to every kind (the pool has no labels)
    assert ok("get", "pools,jobs", "-o", "name", "-l", "team=a", store=store).stdout.splitlines() == [
        "job.reconciler.dev/build"
    ]
    assert ok("get", "pools,jobs", "-o", "name", store=store).stdout.splitlines() == [
        "pool.reconciler.dev/batch",
        "job.reconciler.dev/batch",
        "job.reconciler.dev/build",
        "job.reconciler.dev/web",
    ]


def test_names_with_several_kinds(store):
    # every name in every kind, as kubectl: what exists is printed, each pair that does not is
    # an error (exit 3)
    both = ok("get", "jobs,pools", "batch", "-o", "name", store=store)
    assert both.stdout.splitlines() == ["job.reconciler.dev/batch", "pool.reconciler.dev/batch"]
    partly = cli("get", "jobs,pools", "build", "-o", "name", store=store)
    assert partly.code == 3
    assert partly.stdout.splitlines() == ["job.reconciler.dev/build"]
    assert partly.stderr.strip() == 'error: pools "build" not found'
    listing = json.loads(cli("get", "jobs,pools", "build", "batch", "-o", "json", store=store).stdout)
    assert [(i["kind"], i["metadata"]["name"]) for i in listing["items"]] == [
        ("Job", "batch"),
        ("Job", "build"),
        ("Pool", "batch"),
    ]
    # KIND/NAME pairs, of one kind or several
    pairs = ok("get", "job/build", "pool/batch", "notifier/chat", "-o", "name", store=store)
    assert pairs.stdout.splitlines() == [
        "job.reconciler.dev/build",
        "pool.reconciler.dev/batch",
        "notifier.reconciler.dev/chat",
    ]
    one = json.loads(ok("get", "job/build", "-o", "json", store=store).stdout)
    assert (one["kind"], one["metadata"]["name"]) == ("Job", "build")  # one object, not a List
    missing_pair = cli("get", "job/build", "pool/nope", store=store)
    # one kind found: its plain table, as kubectl qualifies names only when kinds are mixed
    assert missing_pair.code == 3 and missing_pair.stdout.splitlines()[1].split()[0] == "build"
    assert 'pools "nope" not found' in missing_pair.stderr


def test_events_and_services_in_the_list(store):
    out = ok("get", "services,events", store=store).stdout
    services, events = out.split("\n\n")
    assert services.splitlines()[0].split() == ["NAME", "NODE", "ADDRESS", "PORT", "RUN", "READY", "AGE"]
    assert services.splitlines()[1].split()[:2] == ["service.reconciler.dev/web", "n1"]
    assert events.splitlines()[0].split()[:3] == ["LAST", "SEEN", "TYPE"]
    assert "job/build" in events
    listing = json.loads(ok("get", "services,events", "web", "-o", "json", store=store).stdout)
    assert (listing["items"][0]["kind"], listing["items"][0]["metadata"]["name"]) == ("Service", "web")
    events = listing["items"][1:]
    assert events and {e["involvedObject"]["name"] for e in events} == {"web"}  # the named object's events
    # a name a kind lacks: for services, the same NotFound as for any kind
    assert cli("get", "services,events", "build", store=store).code == 3
    # services by name list only those (they listed every service before)
    assert ok("get", "services", "web", "-o", "name", store=store).stdout.splitlines() == ["service.reconciler.dev/web"]
    # an event is named as Kubernetes names one, OBJECT.HEX, each its own (one commit writes
    # several events of an object under one resourceVersion): -o name lists them, event/NAME
    documents = json.loads(ok("get", "events", "-o", "json", store=store).stdout)["items"]
    names = ok("get", "events", "-o", "name", store=store).stdout.splitlines()
    assert names == [f"event/{d['metadata']['name']}" for d in documents]
    assert len(set(names)) == len(names)
    assert len({d["resourceVersion"] for d in documents}) < len(documents)  # shared: not what names them
    assert ok("get", "jobs,events", "-o", "name", store=store).stdout.splitlines()[-len(names) :] == names


def test_usage_errors_print_nothing(store):
    for args in (
        ("jobs,deployments",),  # an unknown kind anywhere in the list
        ("job/build", "web"),  # KIND/NAME mixed with bare names
        ("jobs,pools", "-w"),  # a watch follows one kind
        ("job/",),
        (",",),
    ):
        result = cli("get", *args, store=store)
        assert result.code == 2 and result.stdout == "", (args, result)
        assert "Traceback" not in result.stderr


def test_nothing_found_in_several_kinds(sqlite_url):
    result = cli("get", "jobs,pools", store=sqlite_url)
    assert result.code == 0 and result.stdout == "" and result.stderr.strip() == "No resources found."
    listing = json.loads(ok("get", "jobs,pools", "-o", "json", store=sqlite_url).stdout)
    assert listing == {"apiVersion": "v1", "kind": "List", "items": []}


def test_names_of_one_kind_print_what_exists_then_each_missing_one_as_an_error(store):
    """As kubectl: `get jobs build nope` prints build's row, then the error for nope (exit 3)."""
    result = cli("get", "jobs", "build", "nope", store=store)
    assert result.code == 3, result
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["NAME", "build"]
    assert 'jobs "nope" not found' in result.stderr and "No resources found" not in result.stderr
    named = cli("get", "jobs", "build", "nope", "-o", "name", store=store)
    assert (named.code, named.stdout) == (3, "job.reconciler.dev/build\n")
    # an unknown kind names the kinds the verb takes
    unknown = cli("get", "widgets", store=store)
    assert "known: jobs, pools, nodes, notifiers, sources, services, events" in unknown.stderr
    described = cli("describe", "widget", "x", store=store)
    assert described.code == 2 and described.stderr.rstrip().endswith("known: jobs, pools, nodes, notifiers, sources")


def test_only_missing_names_print_only_the_errors(store):
    for fmt in ("json", "yaml", "name"):
        result = cli("get", "job", "nope", "-o", fmt, store=store)
        assert (result.code, result.stdout) == (3, ""), (fmt, result)
