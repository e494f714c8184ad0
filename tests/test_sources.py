"""Source (API.md 1.3) without a broker: the kind validated as every kind is (file:line: field,
exit 2), a message body read as a job (messages.py: a Job manifest in YAML or JSON, or the
seed's job request, the template under it), and the batch transaction (intake.py) on a real
store: jobs named job-N, the message id kept, a redelivery creating nothing, a refusal
recorded as a Warning event naming the field, and the counts durable in the Source's status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reconciler.api.annotations import CREATED_BY, MESSAGE_ID
from reconciler.api.job import Artifact, JobSpec
from reconciler.api.source import SourceStatus, shown_url
from reconciler.api.status import SUSPENDED_MESSAGE, SUSPENDED_REASON, new_job_status
from reconciler.controller import specs
from reconciler.controller.intake import Intake, Message, note_connection
from reconciler.controller.messages import draft
from reconciler.controller.settled import SettledHints
from reconciler.store import Store, eventlog, ingested
from reconciler.store import repository as repo
from reconciler.store.feed import Change
from tests.helpers import run_cli

API = "reconciler.dev/v1alpha1"
AMQP = {"url": "amqp://guest:guest@127.0.0.1:5672/", "queue": "jobs"}


def source(spec: dict, name: str = "inbox") -> dict:
    return {"apiVersion": API, "kind": "Source", "metadata": {"name": name}, "spec": spec}


# -- the kind ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "key", "field", "words"),
    [
        ({}, "spec:", "spec", "exactly one of amqp or http is required"),
        ({"amqp": AMQP, "http": {"url": "http://q", "queue": "jobs"}}, "spec:", "spec", "exactly one of amqp or http"),
        ({"amqp": {**AMQP, "url": "http://127.0.0.1:5672/"}}, "url:", "spec.amqp.url", "must start with amqp://"),
        ({"http": {"url": "ftp://q", "queue": "jobs"}}, "url:", "spec.http.url", "must start with http://"),
        ({"amqp": {"url": AMQP["url"]}}, "amqp:", "spec.amqp.queue", "required"),
        ({"amqp": AMQP, "template": {"slots": "many"}}, "slots:", "spec.template.slots", "integer"),
        ({"amqp": AMQP, "template": {"pool": "Bad_Pool"}}, "pool:", "spec.template.pool", "DNS-1123"),
        (
            {"amqp": AMQP, "template": {"shell": "true"}},
            "template:",
            "spec.template",
            "shell: the message gives the command",
        ),
        ({"amqp": AMQP, "template": {"labels": {"a b": "c"}}}, "template:", "spec.template", "invalid label key"),
        ({"amqp": AMQP, "template": {"comand": ["x"]}}, "comand:", "spec.template.comand", "unknown field"),
    ],
)
def test_an_invalid_source_is_refused_naming_file_line_and_field(tmp_path, sqlite_url, spec, key, field, words):
    path = tmp_path / "source.yaml"
    text = yaml.safe_dump(source(spec), sort_keys=False)
    path.write_text(text)
    line = 1 + next(i for i, t in enumerate(text.splitlines()) if t.strip().startswith(key))
    result = run_cli("apply", "-f", str(path), store=sqlite_url)
    assert result.code == 2, result.stdout + result.stderr
    assert f"{path}:{line}: {field}: " in result.stderr, result.stderr
    assert words in result.stderr
    assert run_cli("get", "sources", "-o", "name", store=sqlite_url).stdout == ""


POOL = {"apiVersion": API, "kind": "Pool", "metadata": {"name": "batch"}, "spec": {"slots": 2}}


@pytest.mark.parametrize(
    ("template", "key", "field", "words"),
    [
        ({"pool": "nosuch"}, "pool:", "spec.template.pool", "pool 'nosuch' does not exist"),
        ({"pool": "batch", "slots": 5}, "slots:", "spec.template.slots", "5 slots can never fit pool 'batch'"),
        ({"dependsOn": ["nosuch"]}, "- nosuch", "spec.template.dependsOn[0].job", "job 'nosuch' does not exist"),
    ],
)
def test_what_a_template_names_must_exist_and_fit(tmp_path, sqlite_url, template, key, field, words):
    """Every job a Source makes would be refused for it: the Source is refused instead."""
    path = tmp_path / "source.yaml"
    text = yaml.safe_dump_all([POOL, source({"amqp": AMQP, "template": template})], sort_keys=False)
    path.write_text(text)
    lines = text.splitlines()
    after = lines.index("kind: Source")
    line = 1 + next(i for i, t in enumerate(lines) if i > after and t.strip().startswith(key))
    result = run_cli("apply", "-f", str(path), store=sqlite_url)
    assert result.code == 2, result.stdout + result.stderr
    assert f"{path}:{line}: {field}: {words}" in result.stderr, result.stderr
    assert run_cli("get", "sources,pools", "-o", "name", store=sqlite_url).stdout == ""


def test_a_pool_a_template_names_is_not_deleted_before_the_source(tmp_path, sqlite_url):
    path = tmp_path / "source.yaml"
    path.write_text(yaml.safe_dump_all([POOL, source({"amqp": AMQP, "template": {"pool": "batch"}})]))
    assert run_cli("apply", "-f", str(path), store=sqlite_url).code == 0
    refused = run_cli("delete", "pool", "batch", store=sqlite_url)
    assert refused.code == 4 and "named by the template of source(s) inbox" in refused.stderr
    both = run_cli("delete", "source/inbox", "pool/batch", store=sqlite_url)
    assert both.code == 0, both.stderr


def test_a_pool_is_not_lowered_below_what_a_template_asks(tmp_path, sqlite_url):
    """Lowered under a Source's template, the pool would refuse every job the Source makes;
    paused at 0, they are stored and wait."""
    path = tmp_path / "source.yaml"
    path.write_text(yaml.safe_dump_all([POOL, source({"amqp": AMQP, "template": {"pool": "batch", "slots": 2}})]))
    assert run_cli("apply", "-f", str(path), store=sqlite_url).code == 0
    lowered = {**POOL, "spec": {"slots": 1}}
    refused = run_cli("apply", "-f", "-", store=sqlite_url, input=yaml.safe_dump(lowered))
    assert refused.code == 2 and "1 slots is less than the template of source 'inbox' needs (2)" in refused.stderr
    paused = {**POOL, "spec": {"slots": 0}}
    assert run_cli("apply", "-f", "-", store=sqlite_url, input=yaml.safe_dump(paused)).code == 0


def test_a_source_is_stored_shown_and_deleted(tmp_path, sqlite_url):
    path = tmp_path / "source.yaml"
    spec = {"amqp": AMQP, "template": {"labels": {"from": "inbox"}, "pool": "batch", "retry": {"limit": 2}}}
    run_cli("apply", "-f", "-", store=sqlite_url, input=yaml.safe_dump(POOL))
    path.write_text(yaml.safe_dump(source(spec), sort_keys=False))
    assert run_cli("apply", "-f", str(path), store=sqlite_url).stdout == "source.reconciler.dev/inbox created\n"
    table = run_cli("get", "sources", store=sqlite_url).stdout.splitlines()
    assert table[0].split() == ["NAME", "QUEUE", "RECEIVED", "CREATED", "REJECTED", "CONNECTED", "LAST-ERROR", "AGE"]
    assert table[1].split()[:6] == ["inbox", "amqp:jobs", "0", "0", "0", "false"]
    described = run_cli("describe", "source", "inbox", store=sqlite_url).stdout
    assert "URL:      amqp://***@127.0.0.1:5672/" in described  # no password shown
    assert "guest:guest" not in described
    # a password holding an @: hidden up to the last @, where URL parsers split it from the host
    at = {**AMQP, "url": "amqp://guest:top@secret@127.0.0.1:5672/"}
    assert run_cli("apply", "-f", "-", store=sqlite_url, input=yaml.safe_dump(source({"amqp": at}, "at"))).code == 0
    shown = run_cli("describe", "source", "at", store=sqlite_url).stdout
    assert "URL:      amqp://***@127.0.0.1:5672/" in shown and "secret" not in shown
    assert "pool: batch" in described and "Rejected:" in described
    assert run_cli("get", "src", "inbox", "-o", "name", store=sqlite_url).stdout == "source.reconciler.dev/inbox\n"
    deleted = run_cli("delete", "source", "inbox", store=sqlite_url)
    assert deleted.code == 0, deleted.stderr


# -- a message's body -------------------------------------------------------------------------

TEMPLATE = {"labels": {"from": "inbox", "tier": "low"}, "retry": {"limit": 2}, "env": {"A": "1"}, "priority": 5}


def test_the_seed_job_request_becomes_a_job_with_the_template_under_it():
    body = {
        "command": "echo hi",
        "deploy_url": "http://files.local/app.zip",
        "job_type": "service",
        "port": 8080,
        "env_vars": {"B": "2"},
        "instance_id": "worker-2",
        "unknown": "ignored, as the seed ignored it",
    }
    d = draft(json.dumps(body).encode(), TEMPLATE, base_dir=Path("/srv"))
    assert d.problem is None and d.job is not None and not d.named
    spec = d.job.spec
    assert spec.shell == "echo hi" and spec.type == "service" and spec.port == 8080
    assert spec.artifact is not None and spec.artifact.url == "http://files.local/app.zip"
    assert spec.placement.node_name == "worker-2"
    assert spec.env == {"A": "1", "B": "2"}  # mappings merge, the message's keys win
    assert spec.retry.limit == 2 and spec.priority == 5
    assert d.job.metadata.labels == {"from": "inbox", "tier": "low"}


def test_a_message_artifact_replaces_the_templates_whole():
    """The template's sha256 is the digest of its own url's zip: kept beside the message's
    url, the run would get the template's code from the cache (or fail the digest)."""
    template = {"artifact": {"url": "file:///srv/a.zip", "sha256": "a" * 64}}
    d = draft(json.dumps({"command": "sh run.sh", "deploy_url": "file:///srv/b.zip"}).encode(), template)
    assert d.job is not None and d.job.spec.artifact is not None
    assert (d.job.spec.artifact.url, d.job.spec.artifact.sha256) == ("file:///srv/b.zip", None)
    d = draft(json.dumps({"command": "sh run.sh"}).encode(), template)
    assert d.job is not None and d.job.spec.artifact == Artifact(url="file:///srv/a.zip", sha256="a" * 64)


def test_a_job_type_the_request_spells_out_wins_over_the_templates():
    template = {"type": "service"}
    said = draft(json.dumps({"command": "true", "job_type": "run"}).encode(), template)
    unsaid = draft(json.dumps({"command": "true"}).encode(), template)
    assert said.job is not None and said.job.spec.type == "run"
    assert unsaid.job is not None and unsaid.job.spec.type == "service"


def test_a_job_manifest_in_yaml_or_json_wins_over_the_template():
    manifest = {
        "apiVersion": API,
        "kind": "Job",
        "metadata": {"name": "built", "labels": {"tier": "high"}},
        "spec": {"command": ["make"], "retry": {"limit": 0}, "env": {"A": "9"}},
        "status": {"phase": "Running"},  # ignored, as apply ignores it
    }
    for body in (yaml.safe_dump(manifest), json.dumps(manifest)):
        d = draft(body.encode(), TEMPLATE, base_dir=Path("/srv"))
        assert d.problem is None and d.job is not None and d.named
        assert d.job.metadata.name == "built"
        assert d.job.metadata.labels == {"from": "inbox", "tier": "high"}
        assert d.job.spec.retry.limit == 0 and d.job.spec.env == {"A": "9"} and d.job.spec.priority == 5
        assert d.job.spec.working_dir == "/srv"  # no folder to be relative to: where the controller runs


def test_a_manifest_without_a_name_is_named_later():
    body = json.dumps({"apiVersion": API, "kind": "Job", "spec": {"shell": "true"}})
    d = draft(body.encode(), {})
    assert d.problem is None and d.job is not None and not d.named


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"", "body: empty"),
        (b"\xff\xfe", "body: not UTF-8 text"),
        (b"[1, 2]", "body: must be a Job manifest or a job request (a mapping), not a list"),
        (b"key: [unclosed", "body: neither JSON nor YAML (line "),
        (b'{"deploy_url": "http://x/a.zip"}', "command: required (deploy_url only gives"),
        (b'{"command": "true", "job_type": "batch"}', "job_type: "),
        (b'{"command": "true", "port": 80}', "spec.port: port is only allowed on a service job"),
        (
            f'{{"apiVersion": "{API}", "kind": "Pool", "metadata": {{"name": "p"}}}}'.encode(),
            "kind: a message makes a Job",
        ),
        (b'{"apiVersion": "v1", "kind": "Job"}', f"apiVersion: must be {API}"),
        (
            f'{{"apiVersion": "{API}", "kind": "Job", "spec": {{"shell": "x", "slots": "many"}}}}'.encode(),
            "spec.slots: ",
        ),
        (
            json.dumps(
                {"apiVersion": API, "kind": "Job", "metadata": {"name": "A_B"}, "spec": {"shell": "x"}}
            ).encode(),
            "metadata.name: ",
        ),
        (b"a: 1\na: 2\n", "duplicate key"),
        (b"command: a\n---\ncommand: b\n", "body: a message holds one Job; this holds several YAML documents"),
    ],
)
def test_a_body_that_is_no_job_is_refused_naming_the_field(body, problem):
    d = draft(body, {})
    assert d.job is None and d.problem is not None
    assert problem in d.problem, d.problem


# -- the batch transaction --------------------------------------------------------------------


@pytest.fixture
def stored(store_url):
    store = Store(store_url)
    with store.write() as tx:
        obj = repo.create(
            tx, kind="Source", name="inbox", spec={"amqp": AMQP, "template": {}}, labels={}, annotations={}
        )
    yield store, obj.uid
    store.dispose()


def _batch(*messages: tuple[str, str | bytes]) -> list:
    out = []
    for message_id, body in messages:
        raw = body.encode() if isinstance(body, str) else body
        out.append((Message(message_id, raw, message_id), draft(raw, {})))
    return out


def _status(store: Store) -> dict:
    with store.read() as session:
        return repo.get(session, kind="Source", name="inbox").status or {}


def test_a_batch_is_stored_in_one_transaction_and_a_redelivery_creates_nothing(stored):
    store, uid = stored
    intake = Intake(store, "inbox", uid)
    bad = json.dumps(
        {"apiVersion": API, "kind": "Job", "metadata": {"name": "x"}, "spec": {"shell": "x", "pool": "nope"}}
    )
    verdicts = intake.store_batch(_batch(("m1", '{"command": "echo 1"}'), ("m2", bad), ("m3", '{"command": "echo 3"}')))
    assert [(v.outcome, v.job) for v in verdicts] == [("created", "job-1"), ("rejected", None), ("created", "job-2")]
    assert verdicts[1].problem == "spec.pool: pool 'nope' does not exist"

    again = Intake(store, "inbox", uid).store_batch(_batch(("m3", '{"command": "echo 3"}'), ("m4", '{"command": "4"}')))
    assert [(v.outcome, v.job) for v in again] == [("duplicate", "job-2"), ("created", "job-3")]

    with store.read() as session:
        jobs = {o.name: o for o in repo.list_objects(session, kind="Job")}
        events = eventlog.newest(session, kind="Source", name="inbox")
        assert ingested.job_of(session, "inbox", "m3") == "job-2"
    assert sorted(jobs) == ["job-1", "job-2", "job-3"]
    assert jobs["job-2"].annotations == {CREATED_BY: "source/inbox", MESSAGE_ID: "m3"}
    assert jobs["job-2"].spec["shell"] == "echo 3" and jobs["job-2"].status["phase"] == "Waiting"
    [warning] = [e for e in events if e.type == "Warning"]
    assert (warning.reason, warning.message) == ("MessageRejected", "message m2: spec.pool: pool 'nope' does not exist")
    status = _status(store)
    assert {k: status[k] for k in ("received", "created", "duplicates", "rejected")} == {
        "received": 5,
        "created": 3,
        "duplicates": 1,
        "rejected": 1,
    }
    assert status["lastError"] == "message m2: spec.pool: pool 'nope' does not exist"
    SourceStatus.model_validate(status)  # what the controller writes is what the schema (and the CRD) says


def test_a_named_job_that_exists_is_refused_and_names_are_not_reused(stored):
    store, uid = stored
    named = json.dumps({"apiVersion": API, "kind": "Job", "metadata": {"name": "job-7"}, "spec": {"shell": "x"}})
    intake = Intake(store, "inbox", uid)
    first = intake.store_batch(_batch(("a", named), ("b", '{"command": "x"}')))
    assert [(v.outcome, v.job) for v in first] == [("created", "job-7"), ("created", "job-8")]
    second = intake.store_batch(_batch(("c", named)))
    assert second[0].outcome == "rejected" and second[0].problem == "metadata.name: job 'job-7' already exists"


def test_nothing_is_written_for_a_source_deleted_or_made_again(stored):
    store, _ = stored
    assert Intake(store, "inbox", "another-uid").store_batch(_batch(("m1", '{"command": "x"}'))) is None
    with store.read() as session:
        assert repo.list_objects(session, kind="Job") == []


def _spec_text(store) -> str:
    with store.read() as session:
        return repo.get(session, kind="Source", name="inbox").spec_text


def test_the_connection_state_is_written_only_when_it_changes(stored):
    store, uid = stored
    spec = _spec_text(store)
    note_connection(store, "inbox", uid, spec, connected=False, error="refused")
    first = _status(store)
    before = store.change_seq()
    note_connection(store, "inbox", uid, spec, connected=False, error="refused")
    assert store.change_seq() == before  # a broker down for hours costs no write per retry
    note_connection(store, "inbox", uid, spec, connected=True, error=None)
    status = _status(store)
    assert (first["connected"], first["lastError"]) == (False, "refused")
    assert status["connected"] is True and status["lastError"] == "refused"  # the last error stays to be read


def test_a_lane_of_an_earlier_spec_does_not_write_the_connection_state(stored):
    """The lane an edit replaced may still be failing to reach the old queue: its word is
    not the Source's any more (the new lane, consuming, would never say connected again)."""
    store, uid = stored
    spec = _spec_text(store)
    note_connection(store, "inbox", uid, spec, connected=True, error=None)
    before = store.change_seq()
    note_connection(store, "inbox", uid, spec.replace("queue", "queue "), connected=False, error="timed out")
    assert store.change_seq() == before
    assert _status(store)["connected"] is True and "lastError" not in _status(store)


def test_message_ids_are_forgotten_after_a_week(stored):
    """A redelivery comes within minutes; the ids of a week ago are dropped (the table would
    grow by a row a message for ever), and only those."""
    import time

    from reconciler.controller.intake import REMEMBER

    store, uid = stored
    intake = Intake(store, "inbox", uid)
    intake.store_batch(_batch(("old", '{"command": "x"}')))
    assert intake.forget(time.time()) == 0
    assert intake.forget(time.time() + REMEMBER + 1) == 1
    with store.read() as session:
        assert ingested.job_of(session, "inbox", "old") is None
        assert repo.get(session, kind="Job", name="job-1") is not None  # the job stays


def test_a_batch_is_checked_as_its_messages_would_be_one_by_one(stored):
    """The jobs that name no other job are checked together (one validate_apply call); a job
    that names another sees only the jobs of earlier messages, and a failing job of the
    first kind still gets its own field-naming problem while the rest are stored."""
    store, uid = stored
    with store.write() as tx:
        repo.create(tx, kind="Pool", name="small", spec={"slots": 2}, labels={}, annotations={})

    def job(name: str | None, **spec) -> str:
        metadata = {"name": name} if name else {}
        return json.dumps({"apiVersion": API, "kind": "Job", "metadata": metadata, "spec": {"shell": "x", **spec}})

    intake = Intake(store, "inbox", uid)
    verdicts = intake.store_batch(
        _batch(
            ("m1", job("first", pool="small")),
            ("m2", job("second", dependsOn=["first"])),
            ("m3", job("third", dependsOn=["fourth"])),  # a later message's job: not there yet
            ("m4", job("fourth")),
            ("m5", job(None, pool="small", slots=3)),
            ("m6", '{"command": "echo 6"}'),
        )
    )
    assert [(v.outcome, v.job, v.problem) for v in verdicts] == [
        ("created", "first", None),
        ("created", "second", None),
        ("rejected", None, "spec.dependsOn[0].job: job 'fourth' does not exist (neither stored nor in this apply)"),
        ("created", "fourth", None),
        ("rejected", None, "spec.slots: 3 slots can never fit pool 'small' (2 slots)"),
        ("created", "job-1", None),  # m5 was refused before it took a name: job-1 is m6's
    ]
    # every job of this one passes: checked in one call, stored all
    again = intake.store_batch(_batch(("m7", job(None, pool="small")), ("m8", job("eighth", dependsOn=["fourth"]))))
    assert [(v.outcome, v.job) for v in again] == [("created", "job-2"), ("created", "eighth")]
    with store.read() as session:
        names = [o.name for o in repo.list_objects(session, kind="Job")]
    assert sorted(names) == ["eighth", "first", "fourth", "job-1", "job-2", "second"]


def test_a_stored_job_leaves_its_validated_spec_for_its_first_step(stored):
    """The lane validated the job; its model, kept by the stored text, is what validating the
    text again makes (controller/specs.py), so the reconcile step takes it as is."""
    store, uid = stored
    manifest = json.dumps(
        {
            "apiVersion": API,
            "kind": "Job",
            "metadata": {"name": "full"},
            "spec": {"shell": "x", "retry": {"limit": 2, "onExitCodes": [3, 2, 3]}, "timeout": "1m", "env": {"A": "b"}},
        }
    )
    intake = Intake(store, "inbox", uid)
    verdicts = intake.store_batch(_batch(("m1", '{"command": "echo 1", "env_vars": {"N": "1"}}'), ("m2", manifest)))
    assert [v.outcome for v in verdicts] == ["created", "created"]
    with store.read() as session:
        texts = [o.spec_text for o in repo.list_objects(session, kind="Job")]
    for text in texts:
        kept = specs._SPECS[text]
        assert kept == JobSpec.model_validate(json.loads(text))
        assert specs.spec_of("any", text) is kept


def test_a_suspended_job_is_stored_suspended_and_said_so(stored):
    """A job the template (or the message) suspends is stored as the controller's first look
    would leave it, with that look's event after its creation's; the others stay Waiting."""
    store, uid = stored
    messages = [("m1", '{"command": "echo 1"}'), ("m2", json.dumps({"command": "echo 2"}))]
    batch = [(Message(i, b.encode(), i), draft(b.encode(), {"suspend": True})) for i, b in messages]
    batch += _batch(("m3", '{"command": "echo 3"}'))
    assert [v.job for v in Intake(store, "inbox", uid).store_batch(batch)] == ["job-1", "job-2", "job-3"]
    with store.read() as session:
        jobs = {o.name: o for o in repo.list_objects(session, kind="Job")}
        said = {n: [(e.reason, e.message) for e in eventlog.newest(session, kind="Job", name=n)] for n in jobs}
    assert [jobs[n].status["phase"] for n in ("job-1", "job-2", "job-3")] == ["Suspended", "Suspended", "Waiting"]
    assert said["job-1"] == [
        ("Created", "job created from source/inbox (message m1)"),
        (SUSPENDED_REASON, SUSPENDED_MESSAGE),
    ]
    assert said["job-3"] == [("Created", "job created from source/inbox (message m3)")]
    assert jobs["job-1"].status == new_job_status(jobs["job-1"].status["acceptedAt"], suspended=True)


def test_the_jobs_stored_at_rest_are_told_before_the_batch_commits(stored):
    """The suspended jobs of a batch are told (name, resourceVersion, uid) inside its
    transaction, before it commits, so no poll sees them before their hints; the change
    watcher skips exactly those changes (settled.py)."""
    store, uid = stored
    told: list[tuple[str, int, str, bool]] = []

    def settled(at_rest: list[tuple[str, int, str]]) -> None:
        with store.read() as session:  # not committed yet: another connection sees none of them
            seen = {o.name for o in repo.list_objects(session, kind="Job")}
        told.extend((name, rv, job_uid, name in seen) for name, rv, job_uid in at_rest)

    intake = Intake(store, "inbox", uid, settled)
    body = b'{"command": "x"}'
    batch = [(Message(i, body, i), draft(body, {"suspend": True})) for i in ("a", "b")]
    batch += _batch(("c", '{"command": "x"}'))
    assert [v.job for v in intake.store_batch(batch)] == ["job-1", "job-2", "job-3"]
    with store.read() as session:
        jobs = {o.name: o for o in repo.list_objects(session, kind="Job")}
    assert told == [(n, jobs[n].resource_version, jobs[n].uid, False) for n in ("job-1", "job-2")]  # not job-3

    told.clear()
    assert Intake(store, "inbox", "another-uid", settled).store_batch(batch) is None  # nothing written, none told
    assert told == []


def test_a_hint_names_one_change_of_one_job():
    hints = SettledHints()
    hints.add([("job-1", 5, "u1"), ("job-2", 6, "u2")])
    assert not hints.take(Change("Job", "job-1", 7, "u1"))  # a later change: looked at
    assert not hints.take(Change("Job", "job-1", 5, "other"))  # another job of that name (a batch rolled back)
    assert hints.take(Change("Job", "job-1", 5, "u1")) and not hints.take(Change("Job", "job-1", 5, "u1"))
    assert not hints.take(Change("Job", "job-3", 6, "u2"))
    hints.prune(6)  # the watcher is past 6: a hint left at or below is dropped
    assert len(hints) == 0
    hints.add([("job-4", 9, "u4")])
    hints.prune(8)
    assert hints.take(Change("Job", "job-4", 9, "u4"))


def test_a_source_stored_with_looser_rules_is_said_broken_and_not_consumed(stored):
    """A template an earlier version stored (`slots: "2"`, read as a number then) no longer
    validates: its Source says so in its status, once, and the lanes' manager goes on with
    the others (it raised, and the controller exited, on every start)."""
    from reconciler.controller.ingest import Ingester, Wanted

    store, _ = stored
    with store.write() as tx:
        old = repo.create(
            tx,
            kind="Source",
            name="older",
            spec={"amqp": AMQP, "template": {"slots": "2"}},
            labels={},
            annotations={},
        )
    ingester = Ingester(store)
    try:
        ingester._steer({"older": Wanted("older", old.uid, old.spec_text)})
        ingester._steer({"older": Wanted("older", old.uid, old.spec_text)})  # said once
        with store.read() as session:
            status = repo.get(session, kind="Source", name="older").status or {}
        assert status["connected"] is False
        assert "its stored spec does not validate; apply it again, corrected" in status["lastError"]
        assert "older" not in ingester._lanes
    finally:
        for lane, _ in ingester._lanes.values():
            lane.stop(say_stopped=False)


def test_the_shown_url_masks_user_info_up_to_the_last_at_before_the_path():
    assert shown_url("amqp://guest:top@secret@127.0.0.1:5672/") == "amqp://***@127.0.0.1:5672/"
    assert shown_url("amqp://guest:pa?ss@127.0.0.1:5672/") == "amqp://***@127.0.0.1:5672/"  # unescaped
    assert shown_url("http://u:p@h/x?mail=a@b") == "http://***@h/x?mail=a@b"
    assert shown_url("GET http://u:p@h/q failed; see http://v:w@k/r") == "GET http://***@h/q failed; see http://***@k/r"
