"""What a request asks of `reconciler serve` beyond a plain read or write: dry runs (the one
value Kubernetes takes, and on DELETE), DeleteOptions' preconditions, query parameters a
route does not take (refused, not ignored), a watch replayed from the history with a
selector, an events watch with a gap, a viewer's view of passwords, and the metrics of runs
stopped by a deletion."""

from __future__ import annotations

import json
import re
import zipfile

import httpx

from tests.helpers import wait_until
from tests.server.conftest import PREFIX, job_manifest
from tests.server.test_api import Stream, _of
from tests.server.test_security import ADMIN, VIEWER, tokens_file  # noqa: F401 (a fixture)


def _names(http: httpx.Client) -> list[str]:
    return [o["metadata"]["name"] for o in http.get(f"{PREFIX}/jobs").json()["items"]]


def test_delete_with_dry_run_deletes_nothing_and_says_what_would_go(server):
    http = server.http()
    held = job_manifest("keep", suspend=True, labels={"set": "a"})
    assert http.post(f"{PREFIX}/jobs", json=held).status_code == 201
    answer = http.delete(f"{PREFIX}/jobs/keep", params={"dryRun": "All"})
    assert answer.status_code == 200 and answer.json()["metadata"]["name"] == "keep"
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]}
    assert http.request("DELETE", f"{PREFIX}/jobs/keep", json=body).status_code == 200
    collection = http.delete(f"{PREFIX}/jobs", params={"labelSelector": "set=a", "dryRun": "All"})
    assert [o["metadata"]["name"] for o in collection.json()["items"]] == ["keep"]
    assert _names(http) == ["keep"]
    # a field of DeleteOptions it does not honour is refused by name, and nothing is deleted
    refused = http.request("DELETE", f"{PREFIX}/jobs/keep", json={"propagationPolicy": "Foreground"})
    assert refused.status_code == 422 and "propagationPolicy" in refused.text
    assert _names(http) == ["keep"]
    assert http.delete(f"{PREFIX}/jobs/keep").status_code == 200
    assert _names(http) == []


def test_dry_run_takes_all_only(server):
    http = server.http()
    held = job_manifest("d", suspend=True)
    for value in ("false", "bogus", "true"):
        refused = http.post(f"{PREFIX}/jobs", params={"dryRun": value}, json=held)
        assert refused.status_code == 400 and "the only value is All" in refused.json()["message"], refused.text
        assert refused.json()["reason"] == "BadRequest"
    assert http.post(f"{PREFIX}/jobs", params={"dryRun": "All"}, json=held).status_code == 201
    assert _names(http) == []
    assert http.put(f"{PREFIX}/jobs/d", params={"dryRun": "All"}, json=held).status_code == 201
    assert _names(http) == []
    assert http.post(f"{PREFIX}/jobs", params={"dryRun": ""}, json=held).status_code == 201
    assert _names(http) == ["d"]
    assert http.delete(f"{PREFIX}/jobs/d", params={"dryRun": "false"}).status_code == 400
    assert _names(http) == ["d"]


def test_delete_preconditions_are_checked(server):
    http = server.http()
    made = http.post(f"{PREFIX}/jobs", json=job_manifest("p", suspend=True)).json()["metadata"]
    wrong = {"preconditions": {"uid": "not-its-uid"}}
    refused = http.request("DELETE", f"{PREFIX}/jobs/p", json=wrong)
    assert refused.status_code == 409 and "precondition failed" in refused.json()["message"]
    stale = {"preconditions": {"resourceVersion": str(int(made["resourceVersion"]) - 1)}}
    assert http.request("DELETE", f"{PREFIX}/jobs/p", json=stale).status_code == 409
    assert _names(http) == ["p"]
    current = http.get(f"{PREFIX}/jobs/p").json()["metadata"]
    right = {"preconditions": {"uid": current["uid"], "resourceVersion": current["resourceVersion"]}}
    assert http.request("DELETE", f"{PREFIX}/jobs/p", json=right).status_code == 200
    assert _names(http) == []


def test_a_query_parameter_a_request_does_not_take_is_refused(server):
    http = server.http()
    assert http.post(f"{PREFIX}/jobs", json=job_manifest("a1", suspend=True)).status_code == 201
    assert http.post(f"{PREFIX}/jobs", json=job_manifest("a2", suspend=True)).status_code == 201
    for path, params in (
        (f"{PREFIX}/jobs", {"fieldSelector": "metadata.name=a1"}),
        (f"{PREFIX}/jobs", {"limit": "1"}),
        (f"{PREFIX}/events", {"labelSelector": "a=b"}),
        (f"{PREFIX}/jobs/a1", {"dryRun": "All"}),
    ):
        refused = http.get(path, params=params)
        assert refused.status_code == 400, (path, params, refused.text)
        assert f"query parameter {next(iter(params))!r} is not supported here" in refused.json()["message"]
    assert http.get(f"{PREFIX}/jobs", params={"labelSelector": ""}).status_code == 200
    assert http.get("/services", params={"labelSelector": "team=x"}).json() == []


def test_a_watch_from_a_listed_version_replays_each_change_as_the_live_stream_would(server):
    """The changes between a list and its watch come from the history, all at once: a job
    created, then relabelled out of the selector, is ADDED then DELETED; without a selector
    ADDED then MODIFIED, as the live stream says them."""
    http = server.http()
    since = http.get(f"{PREFIX}/jobs", params={"labelSelector": "app=x"}).json()["metadata"]["resourceVersion"]
    # a live stream open meanwhile, which sees the creation before the relabelling is made:
    # each change is an event of its own in the history (with no stream open the server looks
    # once a second, and two changes within it are one, which no stream can tell apart)
    live = Stream(http, f"{PREFIX}/jobs", {"watch": "true", "resourceVersion": since, "timeoutSeconds": 30})
    assert http.post(f"{PREFIX}/jobs", json=job_manifest("c1", suspend=True, labels={"app": "x"})).status_code == 201
    live.until(lambda seen: "ADDED" in _of(seen, "c1"), "c1 created, seen live")
    relabelled = job_manifest("c1", suspend=True, labels={"app": "z"})
    assert http.put(f"{PREFIX}/jobs/c1", json=relabelled).status_code == 200
    live.until(lambda seen: any(e["object"]["metadata"]["labels"] == {"app": "z"} for e in seen), "relabelled")

    def events(selector: str) -> list[str]:
        params = {"watch": "true", "resourceVersion": since, "timeoutSeconds": "1", "labelSelector": selector}
        lines = http.get(f"{PREFIX}/jobs", params=params, timeout=30).text.splitlines()
        return [e["type"] for e in map(json.loads, lines) if e["object"]["metadata"]["name"] == "c1"]

    assert events("app=x") == ["ADDED", "DELETED"]
    assert events("") == ["ADDED", "MODIFIED"]
    assert events("app=z") == ["ADDED"]  # it came to match with its second change


def test_a_watch_from_version_zero_starts_with_what_exists(server):
    http = server.http()
    assert http.post(f"{PREFIX}/jobs", json=job_manifest("z0", suspend=True)).status_code == 201
    params = {"watch": "true", "resourceVersion": "0", "timeoutSeconds": "1"}
    lines = http.get(f"{PREFIX}/jobs", params=params, timeout=30).text.splitlines()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in map(json.loads, lines)][:1] == [("ADDED", "z0")]


def test_an_events_watch_with_more_events_after_its_version_than_its_limit_is_gone(server):
    http = server.http()
    since = http.get(f"{PREFIX}/events").json()["metadata"]["resourceVersion"]
    for i in range(3):  # an event each (Created, at least)
        assert http.post(f"{PREFIX}/jobs", json=job_manifest(f"e{i}", suspend=True)).status_code == 201
    params = {"watch": "true", "resourceVersion": since, "limit": "2", "timeoutSeconds": "1"}
    (line,) = http.get(f"{PREFIX}/events", params=params, timeout=30).text.splitlines()
    gone = json.loads(line)
    assert gone["type"] == "ERROR" and gone["object"]["code"] == 410, gone
    # with room for them all, every one is there
    params["limit"] = "1000"
    lines = http.get(f"{PREFIX}/events", params=params, timeout=30).text.splitlines()
    named = {json.loads(x)["object"]["involvedObject"]["name"] for x in lines}
    assert {"e0", "e1", "e2"} <= named


def test_a_viewer_token_sees_no_password_in_a_url(serve, sqlite_url, tokens_file):  # noqa: F811
    server = serve(sqlite_url, "--tokens", str(tokens_file), "--no-local-node", token=ADMIN)
    admin, viewer = server.http(), server.http(token=VIEWER)
    url = "http://hook-user:S3cretPw@127.0.0.1:9/hook"
    notifier = {
        "apiVersion": "reconciler.dev/v1alpha1",
        "kind": "Notifier",
        "metadata": {"name": "hook"},
        "spec": {"url": url, "events": ["Failed"]},
    }
    since = admin.get(f"{PREFIX}/notifiers").json()["metadata"]["resourceVersion"]
    assert admin.post(f"{PREFIX}/notifiers", json=notifier).status_code == 201
    assert admin.get(f"{PREFIX}/notifiers/hook").json()["spec"]["url"] == url
    shown = "http://***@127.0.0.1:9/hook"
    assert viewer.get(f"{PREFIX}/notifiers/hook").json()["spec"]["url"] == shown
    assert [o["spec"]["url"] for o in viewer.get(f"{PREFIX}/notifiers").json()["items"]] == [shown]
    params = {"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"}
    streamed = viewer.get(f"{PREFIX}/notifiers", params=params, timeout=30).text
    assert "S3cretPw" not in streamed and shown in streamed
    assert "S3cretPw" in admin.get(f"{PREFIX}/notifiers", params=params, timeout=30).text
    # a Source's queue and its template's artifact; the seed's view of a job; a node's runs
    source = {
        "apiVersion": "reconciler.dev/v1alpha1",
        "kind": "Source",
        "metadata": {"name": "inbox"},
        "spec": {
            "http": {"url": "http://q-user:Qpw@127.0.0.1:9", "queue": "jobs"},
            "template": {"artifact": {"url": "http://a-user:Apw@127.0.0.1:9/app.zip"}},
        },
    }
    assert admin.post(f"{PREFIX}/sources", json=source).status_code == 201, "a Source"
    seen = viewer.get(f"{PREFIX}/sources/inbox").json()["spec"]
    assert (seen["http"]["url"], seen["template"]["artifact"]["url"]) == (
        "http://***@127.0.0.1:9",
        "http://***@127.0.0.1:9/app.zip",
    )
    made = admin.post("/jobs", json={"command": "true", "deploy_url": "http://d-user:Dpw@127.0.0.1:9/d.zip"})
    assert made.status_code == 201
    assert [j.get("deploy_url") for j in viewer.get("/jobs").json()] == ["http://***@127.0.0.1:9/d.zip"]
    assert "Dpw" in admin.get("/jobs").text
    refused = viewer.get(f"{PREFIX}/nodes/any/runs")
    assert refused.status_code == 403 and "its agent's to read" in refused.json()["message"]


def _counted(http: httpx.Client, outcome: str, reason: str) -> float:
    pattern = rf'^reconciler_runs_total\{{outcome="{outcome}",reason="{reason}"\}} (\S+)$'
    found = re.search(pattern, http.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_run_stopped_by_its_jobs_deletion_is_counted(server):
    http = server.http()
    assert http.post(f"{PREFIX}/jobs", json=job_manifest("long", ["sleep", "60"])).status_code == 201
    wait_until(lambda: server.job("long")["status"].get("phase") == "Running", timeout=30, message="running")
    before = _counted(http, "Cancelled", "Deleted")
    assert http.delete(f"{PREFIX}/jobs/long").status_code == 202
    wait_until(lambda: "long" not in _names(http), timeout=30, message="deleted")
    assert _counted(http, "Cancelled", "Deleted") == before + 1


def test_a_seed_request_with_a_deploy_url_runs_in_its_unpacked_files(server, tmp_path):
    """The artifact's folder is the run's working directory (API.md 1.1), not the folder the
    server was started in."""
    archive = tmp_path / "app.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("app/hello.txt", "from the artifact\n")
    http = server.http()
    made = http.post("/jobs", json={"command": "cat app/hello.txt", "deploy_url": archive.as_uri()})
    assert made.status_code == 201, made.text
    name = made.json()["job_id"]
    wait_until(lambda: server.job(name)["status"].get("phase") == "Completed", timeout=60, message="completed")
    assert "workingDir" not in server.job(name)["spec"]
    assert server.job(name)["status"]["outcome"] == "Succeeded", server.job(name)["status"]
    assert http.get(f"{PREFIX}/jobs/{name}/log").text == "from the artifact\n"


def test_a_method_a_path_does_not_take_is_a_405_status_saying_so(server):
    answer = server.http().patch(f"{PREFIX}/jobs/x", json={})
    assert answer.status_code == 405
    assert (answer.json()["kind"], answer.json()["reason"]) == ("Status", "MethodNotAllowed")


def test_a_body_that_is_not_a_json_object_is_refused_saying_so(server):
    """A form-encoded body is 415 naming the type a body must have; a JSON body that is not an
    object is 422 saying what it must be (both were a terse ': Input should be a valid
    dictionary'); nothing is created."""
    http = server.http()
    form = http.post(f"{PREFIX}/jobs", content="a=b", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415, form.text
    assert form.json()["reason"] == "UnsupportedMediaType"
    assert "must be a JSON object (Content-Type: application/json)" in form.json()["message"], form.text
    listed = http.post(f"{PREFIX}/jobs", json=[job_manifest("j")])
    assert listed.status_code == 422 and listed.json()["message"] == "the request body must be a JSON object", (
        listed.text
    )
    assert _names(http) == []


def test_a_put_without_a_name_says_the_name_is_missing(server):
    http = server.http()
    body = job_manifest("x")
    del body["metadata"]["name"]
    answer = http.put(f"{PREFIX}/jobs/x", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"] == "metadata.name: required field is missing (the URL names 'x')"
    assert _names(http) == []
