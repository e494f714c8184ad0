"""The HTTP API of API.md section 4 against a real `reconciler serve`: Kubernetes-shaped
resources, apply, watch streams, per-job actions, logs, the registry, Status errors."""

from __future__ import annotations

import contextlib
import json
import queue
import threading

import httpx

from tests.helpers import wait_until
from tests.server.conftest import PREFIX, job_manifest, settled


class Stream:
    """A watch stream read in a thread: its events arrive in `events` as they come."""

    def __init__(self, client: httpx.Client, path: str, params: dict):
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        self._thread = threading.Thread(target=self._read, args=(client, path, params), daemon=True)
        self._thread.start()

    def _read(self, client: httpx.Client, path: str, params: dict) -> None:
        timeout = httpx.Timeout(30, read=None)
        # the server stopping after the test cuts the stream
        with contextlib.suppress(httpx.HTTPError), client.stream("GET", path, params=params, timeout=timeout) as answer:
            for line in answer.iter_lines():
                if line.strip():
                    self.events.put(json.loads(line))
        self.events.put(None)

    def until(self, predicate, message: str) -> list[dict]:
        """Events read so far once `predicate(events)` holds."""

        def check():
            while True:
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    break
                if event is not None:
                    self.seen.append(event)
            return predicate(self.seen)

        wait_until(check, timeout=30, message=message)
        return self.seen


JSON = {"Content-Type": "application/json"}


def _of(events: list[dict], name: str) -> list[str]:
    return [e["type"] for e in events if e["object"]["metadata"]["name"] == name]


def test_apply_then_list_then_watch_from_its_resource_version(server):
    http = server.http()
    answer = http.post(f"{PREFIX}/apply", json={"items": [job_manifest("a"), job_manifest("b")]})
    assert answer.status_code == 200, answer.text
    assert [(i["name"], i["action"]) for i in answer.json()["items"]] == [("a", "created"), ("b", "created")]
    again = http.post(f"{PREFIX}/apply", json={"items": [job_manifest("a")], "dryRun": True}).json()
    assert [i["action"] for i in again["items"]] == ["unchanged"] and again["dryRun"] is True
    settled(server, "a", "b")

    listing = http.get(f"{PREFIX}/jobs").json()
    assert listing["kind"] == "JobList" and listing["apiVersion"] == "reconciler.dev/v1alpha1"
    assert [o["metadata"]["name"] for o in listing["items"]] == ["a", "b"]
    since = int(listing["metadata"]["resourceVersion"])

    # changes made before the stream opens are sent from the history, each classified exactly
    changed = job_manifest("a", labels={"tier": "x"})
    assert http.put(f"{PREFIX}/jobs/a", json=changed).status_code == 200
    assert http.post(f"{PREFIX}/jobs", json=job_manifest("c")).status_code == 201
    stream = Stream(http, f"{PREFIX}/jobs", {"watch": "true", "resourceVersion": str(since), "timeoutSeconds": 20})
    events = stream.until(lambda ev: "ADDED" in _of(ev, "c") and "MODIFIED" in _of(ev, "a"), "catch-up events")
    assert _of(events, "a")[0] == "MODIFIED" and _of(events, "c")[0] == "ADDED"
    assert "b" not in {e["object"]["metadata"]["name"] for e in events}  # unchanged since the list
    assert all(int(e["object"]["metadata"]["resourceVersion"]) > since for e in events)

    # live: c is changed (MODIFIED), then deleted
    settled(server, "c")
    assert http.put(f"{PREFIX}/jobs/c", json=job_manifest("c", labels={"tier": "y"})).status_code == 200
    stream.until(lambda ev: ev[-1]["object"]["metadata"].get("labels") == {"tier": "y"}, "c relabelled")
    assert http.delete(f"{PREFIX}/jobs/c").status_code == 200
    events = stream.until(lambda ev: "DELETED" in _of(ev, "c"), "c deleted")
    kinds = _of(events, "c")
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED" and "MODIFIED" in kinds[1:-1]
    of_c = [e["object"]["metadata"] for e in events if e["object"]["metadata"]["name"] == "c"]
    versions = [int(meta["resourceVersion"]) for meta in of_c]
    assert versions == sorted(versions)


def test_watch_without_resource_version_starts_with_every_object_and_follows_a_selector(server):
    http = server.http()
    items = [job_manifest("keep", labels={"team": "x"}), job_manifest("other", labels={"team": "y"})]
    assert http.post(f"{PREFIX}/apply", json={"items": items}).status_code == 200
    settled(server, "keep", "other")
    stream = Stream(http, f"{PREFIX}/jobs", {"watch": "true", "labelSelector": "team=x", "timeoutSeconds": 20})
    events = stream.until(lambda ev: "ADDED" in _of(ev, "keep"), "the existing object first")
    assert _of(events, "other") == []
    # `other` comes to match: ADDED; `keep` stops matching: DELETED (as Kubernetes reports it)
    http.put(f"{PREFIX}/jobs/other", json=job_manifest("other", labels={"team": "x"}))
    http.put(f"{PREFIX}/jobs/keep", json=job_manifest("keep", labels={"team": "z"}))
    events = stream.until(lambda ev: _of(ev, "other") and len(_of(ev, "keep")) > 1, "selector changes")
    assert _of(events, "other") == ["ADDED"] and _of(events, "keep") == ["ADDED", "DELETED"]


def test_a_watch_from_a_version_the_store_has_not_reached_is_refused_not_left_silent(server):
    """A version of another store (or of this one before it was replaced) would never see a
    change: the stream says so at once, as Kubernetes' "Too large resource version"."""
    http = server.http()
    listed = int(http.get(f"{PREFIX}/jobs").json()["metadata"]["resourceVersion"])
    params = {"watch": "true", "resourceVersion": str(listed + 1000), "timeoutSeconds": "20"}
    answer = http.get(f"{PREFIX}/jobs", params=params)
    [line] = [json.loads(text) for text in answer.text.splitlines() if text]
    assert line["type"] == "ERROR" and line["object"]["code"] == 504, line
    assert "too large resource version" in line["object"]["message"]
    current = http.get(
        f"{PREFIX}/jobs", params={"watch": "true", "resourceVersion": str(listed), "timeoutSeconds": "1"}
    )
    assert current.status_code == 200 and "ERROR" not in current.text  # its own version is watched
    events = http.get(f"{PREFIX}/events", params=params)  # the events watch says the same
    [line] = [json.loads(text) for text in events.text.splitlines() if text]
    assert line["type"] == "ERROR" and line["object"]["code"] == 504, line


def test_apply_refusal_is_422_naming_each_object_and_field_and_stores_nothing(server):
    http = server.http()
    bad_ref = job_manifest("b", dependsOn=["ghost"])
    unknown = job_manifest("c")
    unknown["spec"]["comand"] = ["x"]
    answer = http.post(f"{PREFIX}/apply", json={"items": [job_manifest("a"), bad_ref, unknown]})
    assert answer.status_code == 422
    status = answer.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid" and status["code"] == 422
    fields = {c["field"]: c["message"] for c in status["details"]["causes"]}
    assert "does not exist" in fields["items[1].spec.dependsOn[0].job"]
    assert fields["items[2].spec.comand"] == "unknown field"
    assert http.get(f"{PREFIX}/jobs").json()["items"] == []


def test_put_with_a_stale_resource_version_is_409_and_create_of_an_existing_object_too(server):
    http = server.http()
    created = http.post(f"{PREFIX}/pools", json=_pool("p", 2))
    assert created.status_code == 201
    rv = created.json()["metadata"]["resourceVersion"]
    again = http.post(f"{PREFIX}/pools", json=_pool("p", 2))
    assert again.status_code == 409 and again.json()["reason"] == "Conflict"
    assert "already exists" in again.json()["message"]

    fresh = _pool("p", 3)
    fresh["metadata"]["resourceVersion"] = rv
    updated = http.put(f"{PREFIX}/pools/p", json=fresh)
    assert updated.status_code == 200 and updated.json()["spec"]["slots"] == 3
    stale = _pool("p", 4)
    stale["metadata"]["resourceVersion"] = rv
    refused = http.put(f"{PREFIX}/pools/p", json=stale)
    assert refused.status_code == 409
    assert refused.json()["kind"] == "Status" and "stale" in refused.json()["message"]
    assert http.get(f"{PREFIX}/pools/p").json()["spec"]["slots"] == 3
    renamed = http.put(f"{PREFIX}/pools/q", json=_pool("p", 1))
    assert renamed.status_code == 422 and "does not match" in renamed.json()["message"]


def test_a_put_carrying_the_version_or_uid_of_a_deleted_object_does_not_make_it_again(server):
    """Kubernetes' preconditions: a writer holding a copy read before a delete must not undo it."""
    http = server.http()
    created = http.put(f"{PREFIX}/pools/gone", json=_pool("gone", 1)).json()
    assert http.delete(f"{PREFIX}/pools/gone").status_code == 200
    for field in ("resourceVersion", "uid"):
        old = _pool("gone", 5)
        old["metadata"][field] = created["metadata"][field]
        refused = http.put(f"{PREFIX}/pools/gone", json=old)
        assert refused.status_code == 409, refused.text
        assert "deleted since the manifest was read" in refused.json()["message"]
    assert http.get(f"{PREFIX}/pools/gone").status_code == 404
    assert http.put(f"{PREFIX}/pools/gone", json=_pool("gone", 5)).status_code == 201  # without them: created


def test_a_refusal_of_one_object_names_its_fields_alone(server):
    """PUT and POST carry one object, not a list: a refusal names `spec.bogus`, not
    `items[0].spec.bogus` of an `items` the request never had."""
    http = server.http()
    bad = {**_pool("solo", 1), "spec": {"slots": 1, "bogus": 1}}
    for answer in (http.put(f"{PREFIX}/pools/solo", json=bad), http.post(f"{PREFIX}/pools", json=bad)):
        assert answer.status_code == 422, answer.text
        assert [c["field"] for c in answer.json()["details"]["causes"]] == ["spec.bogus"]
        assert "items[" not in answer.json()["message"]
    created = http.put(f"{PREFIX}/pools/solo", json=_pool("solo", 1)).json()
    stale = _pool("solo", 2)
    stale["metadata"]["resourceVersion"] = str(int(created["metadata"]["resourceVersion"]) - 1)
    refused = http.put(f"{PREFIX}/pools/solo", json=stale)
    assert refused.status_code == 409 and refused.json()["message"].startswith("metadata.resourceVersion: ")


def _pool(name: str, slots: int) -> dict:
    return {
        "apiVersion": "reconciler.dev/v1alpha1",
        "kind": "Pool",
        "metadata": {"name": name},
        "spec": {"slots": slots},
    }


def test_a_status_given_to_the_api_is_ignored_with_a_warning(server):
    """API.md 1: status is written only by the system; ignored (with a warning) on apply, as
    a Kubernetes API server warns: a `Warning: 299` header, and in an ApplyResult its list."""
    http = server.http()
    given = job_manifest("told", suspend=True)
    given["status"] = {"phase": "Running"}
    applied = http.post(f"{PREFIX}/apply", json={"items": [job_manifest("plain", suspend=True), given]})
    assert applied.status_code == 200
    assert applied.json()["warnings"] == ["items[1] (Job/told): status is written only by the system; ignored"]
    assert applied.headers.get_list("warning") == ['299 - "' + applied.json()["warnings"][0] + '"']
    assert http.get(f"{PREFIX}/jobs/told").json()["status"]["phase"] == "Suspended"
    put = http.put(f"{PREFIX}/jobs/other", json={**given, "metadata": {"name": "other"}})
    assert put.status_code == 201 and "status is written only by the system" in put.headers["warning"]
    quiet = http.put(f"{PREFIX}/jobs/plain", json=job_manifest("plain", suspend=True))
    assert "warning" not in quiet.headers


def test_errors_are_kubernetes_status_objects(server):
    http = server.http()
    cases = [
        (http.get(f"{PREFIX}/widgets"), 404, "NotFound"),
        (http.get(f"{PREFIX}/jobs/nope"), 404, "NotFound"),
        (http.get(f"{PREFIX}/jobs", params={"labelSelector": "a in (b"}), 422, "Invalid"),
        (http.post(f"{PREFIX}/apply", content=b"{not json", headers=JSON), 400, "BadRequest"),
        (http.post(f"{PREFIX}/apply", json={"items": [], "bogus": 1}), 422, "Invalid"),
        (http.post(f"{PREFIX}/jobs/nope/cancel"), 404, "NotFound"),
        (http.post(f"{PREFIX}/jobs/nope/explode"), 404, "NotFound"),
        (http.delete(f"{PREFIX}/jobs"), 422, "Invalid"),
    ]
    for response, code, reason in cases:
        body = response.json()
        assert response.status_code == code, (response.request.url, response.text)
        assert body["kind"] == "Status" and body["code"] == code and body["reason"] == reason, body
    assert http.get(f"{PREFIX}/jobs/nope").json()["message"] == 'jobs "nope" not found'


def test_a_request_body_over_the_limit_is_413(server):
    big = b'{"items": [' + b" " * (9 * 2**20) + b"]}"
    answer = server.http().post(f"{PREFIX}/apply", content=big, headers=JSON)
    assert answer.status_code == 413 and answer.json()["reason"] == "RequestEntityTooLarge"


def test_openapi_document_and_health(server):
    http = server.http()
    document = http.get("/openapi.json").json()
    for path in (f"{PREFIX}/apply", f"{PREFIX}/{{plural}}", f"{PREFIX}/jobs/{{name}}/log", "/jobs", "/healthz"):
        assert path in document["paths"], path
    assert http.get("/healthz").text == "ok"
    discovery = http.get(PREFIX).json()
    assert {r["name"] for r in discovery["resources"]} == {"jobs", "pools", "nodes", "notifiers", "sources"}


def _keys(node: object) -> set[str]:
    """Every key of every object in a JSON document."""
    if isinstance(node, dict):
        return set(node).union(*(_keys(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_keys(v) for v in node))
    return set()


def test_the_openapi_document_shows_the_64_bit_bound_of_an_agents_integers(server):
    # a report's integers are refused past 64 bits (422): the document says so (OpenAPI's
    # int64 is a signed 64-bit integer), and a field's own bound (ge=1, ge=0) is shown as JSON
    # Schema's minimum, not under pydantic's name for it
    schemas = server.http().get("/openapi.json").json()["components"]["schemas"]
    report = schemas["RunReport"]["properties"]
    run, exit_code = report["run"], report["exitCode"]["anyOf"][0]
    assert (run["type"], run["format"], run["minimum"]) == ("integer", "int64", 1)
    assert (exit_code["type"], exit_code["format"]) == ("integer", "int64") and "minimum" not in exit_code
    slots = schemas["Capacity"]["properties"]["slots"]["anyOf"][0]
    assert (slots["type"], slots["format"], slots["minimum"]) == ("integer", "int64", 0)
    assert not {"ge", "le", "gt", "lt"} & _keys(schemas)


def test_the_seeds_post_jobs_and_get_jobs_with_filters(server):
    http = server.http()
    first = http.post("/jobs", json={"command": "echo $GREETING", "env_vars": {"GREETING": "seeded"}})
    assert first.status_code == 201, first.text
    job = first.json()
    assert job["job_id"] == "job-1" and job["status"] in ("pending", "running", "done") and job["exit_code"] is None
    second = http.post("/jobs", json={"command": "exit 3", "job_type": "run", "unknown_field": "ignored"})
    assert second.json()["job_id"] == "job-2"
    settled(server, "job-1", "job-2")

    every = http.get("/jobs").json()
    assert isinstance(every, list) and {j["job_id"] for j in every} == {"job-1", "job-2"}
    node = every[0]["node_id"]
    assert node and all(j["node_id"] == node for j in every)
    done = http.get("/jobs", params={"status": "done"}).json()
    assert [(j["job_id"], j["exit_code"]) for j in done] == [("job-1", 0)]
    failed = http.get("/jobs", params={"status": "failed", "node_id": node}).json()
    assert [(j["job_id"], j["exit_code"], j["status"]) for j in failed] == [("job-2", 3, "failed")]
    assert http.get("/jobs", params={"node_id": "elsewhere"}).json() == []
    assert http.get("/jobs", params={"status": "sleeping"}).status_code == 422
    assert http.get(f"{PREFIX}/jobs/job-1/log").text == "seeded\n"

    refused = http.post("/jobs", json={})
    assert refused.status_code == 422 and refused.json()["kind"] == "Status"
    pinned = http.post("/jobs", json={"command": "true", "instance_id": "worker-9"}).json()
    assert pinned["instance_id"] == "worker-9" and pinned["status"] == "pending"


def test_log_follow_streams_lines_while_the_job_runs(server, tmp_path):
    gate = tmp_path / "gate"
    shell = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second; echo oops >&2"
    http = server.http()
    http.post(f"{PREFIX}/apply", json={"items": [job_manifest("talk", command=["sh", "-c", shell])]})
    wait_until(lambda: server.job("talk").get("status", {}).get("phase") == "Running", timeout=30)
    received: queue.Queue = queue.Queue()

    def read() -> None:
        params = {"follow": "true", "stream": "stdout"}
        with http.stream("GET", f"{PREFIX}/jobs/talk/log", params=params, timeout=httpx.Timeout(30, read=None)) as r:
            for piece in r.iter_text():
                received.put(piece)
        received.put(None)

    threading.Thread(target=read, daemon=True).start()
    text: list[str] = []

    def got(word: str):
        def check():
            while not received.empty():
                piece = received.get()
                text.append("<end>" if piece is None else piece)
            return word in "".join(text)

        return check

    wait_until(got("first"), timeout=30, message="the first line while the job runs")
    assert server.job("talk")["status"]["phase"] == "Running"  # streamed before the run ended
    gate.touch()
    wait_until(got("<end>"), timeout=30, message="the stream ends with the run")
    assert "".join(text) == "first\nsecond\n<end>"
    assert http.get(f"{PREFIX}/jobs/talk/log", params={"stream": "stderr"}).text == "oops\n"
    assert http.get(f"{PREFIX}/jobs/talk/log", params={"tailLines": 1, "stream": "stdout"}).text == "second\n"
    assert http.get(f"{PREFIX}/jobs/talk/log", params={"run": 7}).status_code == 404


def test_job_actions_and_deletes(server):
    http = server.http()
    http.post(f"{PREFIX}/apply", json={"items": [job_manifest("j", suspend=True)]})
    assert http.post(f"{PREFIX}/jobs/j/suspend").json()["message"] == "unchanged"
    assert http.post(f"{PREFIX}/jobs/j/resume").json()["message"] == "resumed"
    settled(server, "j")
    assert http.post(f"{PREFIX}/jobs/j/cancel").json()["message"] == "already completed (Succeeded)"
    rerun = http.post(f"{PREFIX}/jobs/j/rerun", params={"downstream": "true"})
    assert rerun.status_code == 200 and rerun.json()["message"] == "rerun requested"
    wait_until(lambda: server.job("j")["status"].get("revision") == 2, timeout=30, message="a new revision")
    settled(server, "j")
    assert http.delete(f"{PREFIX}/jobs/j").status_code == 200
    assert http.delete(f"{PREFIX}/jobs/j").status_code == 404


def test_metrics_through_the_api(server):
    http = server.http()
    http.post(f"{PREFIX}/apply", json={"items": [job_manifest("m1"), job_manifest("m2", command=["false"])]})
    settled(server, "m1", "m2")
    answer = http.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    lines = answer.text.splitlines()
    assert 'reconciler_jobs{outcome="Succeeded",phase="Completed"} 1.0' in lines
    assert 'reconciler_jobs{outcome="Failed",phase="Completed"} 1.0' in lines
    assert 'reconciler_runs_total{outcome="Failed",reason=""} 1.0' in lines


def test_an_events_watch_streams_each_new_event(server):
    """GET events?watch=true: the newest events as ADDED, then each new one; with
    resourceVersion, only those after it."""
    http = server.http()
    http.post(f"{PREFIX}/apply", json={"items": [job_manifest("first", labels={}, suspend=True)]})
    listed = http.get(f"{PREFIX}/events").json()
    since = listed["items"][-1]["metadata"]["resourceVersion"]
    found: queue.Queue = queue.Queue()

    def follow(params: dict) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),  # the server goes first when the test ends
            httpx.Client(base_url=server.url, timeout=30) as client,
            client.stream("GET", f"{PREFIX}/events", params=params) as answer,
        ):
            for line in answer.iter_lines():
                if line:
                    found.put((params.get("resourceVersion"), json.loads(line)))

    versionless = {"watch": "true", "timeoutSeconds": "20"}
    for params in (versionless, {**versionless, "resourceVersion": since}):
        threading.Thread(target=follow, args=(params,), daemon=True).start()
    seen: list[tuple[str | None, str]] = []

    def names_seen() -> set[tuple[str | None, str]]:
        while not found.empty():
            version, line = found.get()
            assert line["type"] == "ADDED" and line["object"]["kind"] == "Event", line
            seen.append((version, line["object"]["involvedObject"]["name"]))
        return set(seen)

    wait_until(lambda: (None, "first") in names_seen(), timeout=30, message="the listing of the versionless watch")
    http.post(f"{PREFIX}/apply", json={"items": [job_manifest("second", labels={}, suspend=True)]})
    wait_until(
        lambda: {(None, "second"), (since, "second")} <= names_seen(), timeout=30, message="second's events, twice"
    )
    assert (since, "first") not in names_seen()  # recorded before the version it watches from


def test_the_service_registry(server):
    http = server.http()
    service = job_manifest("web", command=["sleep", "60"], type="service", port=8080)
    http.post(f"{PREFIX}/apply", json={"items": [service, job_manifest("batch")]})
    entries = wait_until(lambda: http.get("/services").json(), timeout=30, message="web registered")
    assert len(entries) == 1
    entry = entries[0]
    assert entry["name"] == "web" and entry["port"] == 8080 and entry["run"] == 1 and entry["ready"] is True
    assert entry["node"] and entry["address"]
    # `get services` prints the same object through the server as from the store: its
    # generation and creation time are the job's, not zeros
    local, remote = server.local("get", "services", "-o", "json"), server.cli("get", "services", "-o", "json")
    assert local.code == remote.code == 0, (local, remote)
    [shown] = [item["metadata"] for item in json.loads(remote.stdout)["items"]]
    assert [shown] == [item["metadata"] for item in json.loads(local.stdout)["items"]]
    assert shown["generation"] == 1 and shown["creationTimestamp"] == server.job("web")["metadata"]["creationTimestamp"]
    http.post(f"{PREFIX}/jobs/web/cancel")
    wait_until(lambda: http.get("/services").json() == [], timeout=30, message="web gone from the registry")
