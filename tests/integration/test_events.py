"""Events: the story of a job with a retry, in `get events` and `describe job`."""

from __future__ import annotations

import json

from .conftest import job_yaml

STORY = [
    "Created",
    "Eligible",
    "Admitted",
    "Scheduled",
    "Started",
    "Exited",
    "BackoffScheduled",
    "BackoffElapsed",
    "Admitted",
    "Scheduled",
    "Started",
    "Exited",
    "Succeeded",
]


def test_events_of_a_retried_job(env):
    marker = env.root / "failed-once"
    manifest = env.write(
        "flaky.yaml",
        job_yaml(
            "flaky",
            f"""
        shell: "if [ -e '{marker}' ]; then exit 0; fi; touch '{marker}'; exit 1"
        retry: {{limit: 1, backoff: {{delay: 100ms}}}}
    """,
        ),
    )
    result = env.up(manifest, timeout="30s")
    assert result.code == 0, result.stderr

    listing = json.loads(env.ok("get", "events", "-o", "json").stdout)
    mine = [
        e
        for e in listing["items"]
        if e["involvedObject"] == {"kind": "Job", "name": "flaky", "uid": e["involvedObject"]["uid"]}
    ]
    assert [e["reason"] for e in mine] == STORY
    assert {e["involvedObject"]["uid"] for e in mine} == {env.peek("flaky")["metadata"]["uid"]}
    exited = [e for e in mine if e["reason"] == "Exited"]
    assert [e["type"] for e in exited] == ["Warning", "Normal"]
    assert "exit code 1" in exited[0]["message"]

    table = env.ok("get", "events").stdout.splitlines()
    assert table[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert [line.split()[2] for line in table[1:] if line.split()[3] == "job/flaky"] == STORY

    described = env.ok("describe", "job", "flaky").stdout
    events = described.split("\nEvents:\n", 1)[1].splitlines()
    assert [line.split()[2] for line in events[1:]] == STORY


def test_describe_shows_the_events_of_this_object_not_of_one_deleted_before_under_its_name(env):
    manifest = env.write("again.yaml", job_yaml("again", "command: ['true']\nsuspend: true"))
    env.ok("apply", "-f", str(manifest))
    env.ok("delete", "job", "again")
    env.ok("apply", "-f", str(manifest))
    described = env.ok("describe", "job", "again").stdout
    events = described[described.index("Events:") :]
    assert events.count("Created") == 1 and "Deleted" not in events, described
