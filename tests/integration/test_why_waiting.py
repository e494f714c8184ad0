"""`describe` and `get -o wide` say why a job waits, in the words the dashboard uses
(reconciler/waiting.py): its place in its pool's line and the scope that is full, the
dependency or wait condition not met, a node that cannot take it."""

from __future__ import annotations

from reconciler.waiting import ordinal

from .conftest import docs, held_until, job_yaml, pool_yaml


def _why(env, name: str) -> str:
    """The `Why Waiting:` line of `describe job NAME`."""
    out = env.ok("describe", "job", name).stdout
    line = next((line for line in out.splitlines() if line.startswith("Why Waiting:")), None)
    assert line is not None, out
    return line.split(":", 1)[1].strip()


def _message_column(env) -> dict[str, str]:
    """NAME -> the MESSAGE column (the last) of `get jobs -o wide`."""
    header, *rows = env.ok("get", "jobs", "-o", "wide").stdout.splitlines()
    start = header.index("MESSAGE")
    return {row.split()[0]: row[start:].strip() for row in rows}


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
        "111th",
    ]


def test_queue_place_dependency_and_wait_said_alike(env):
    go = env.root / "go"
    env.controller()
    env.apply("hold.yaml", docs(pool_yaml("batch", 1), job_yaml("hold", held_until(go) + "\npool: batch")))
    env.wait_phase("hold", "Running")
    env.apply(
        "line.yaml",
        docs(
            job_yaml("q1", "command: ['true']\npool: batch"),
            job_yaml("q2", "command: ['true']\npool: batch\nwaitFor: {conditions: [{delay: 200ms}]}"),
            job_yaml("q3", "command: ['true']\npool: batch\nwaitFor: {conditions: [{delay: 400ms}]}"),
            job_yaml("after", "command: ['true']\ndependsOn: [{job: q3}]"),
            job_yaml("gated", f"command: ['true']\nwaitFor: {{conditions: [{{path: '{env.root / 'flag'}'}}]}}"),
        ),
    )
    for name in ("q1", "q2", "q3"):
        env.wait_phase(name, "Queued")
    env.wait_status("gated", lambda s: s.get("waits"), what="gated's wait evaluated")

    full = "pool batch is full (1/1 slots in use, 1 needed)"
    assert _why(env, "q1") == f"1st of 3 in pool batch; {full}"
    assert _why(env, "q2") == f"2nd of 3 in pool batch; {full}"
    assert _why(env, "q3") == f"3rd of 3 in pool batch; {full}"
    assert _why(env, "after") == "dependency q3 has yet to succeed"
    assert _why(env, "gated") == f"wait path unmet: {env.root / 'flag'} does not exist"
    assert "Why Waiting:" not in env.ok("describe", "job", "hold").stdout  # running: it does not wait

    column = _message_column(env)
    assert column["q2"] == f"2nd of 3 in pool batch; {full}"
    assert column["after"] == "dependency q3 has yet to succeed"
    assert column["gated"] == f"wait path unmet: {env.root / 'flag'} does not exist"

    go.touch()
    env.wait_completed("hold", "q1", "q2", "q3", "after")
    assert "Why Waiting:" not in env.ok("describe", "job", "after").stdout


def test_no_node_fits_said(env):
    env.controller()
    env.apply("pinned.yaml", job_yaml("pinned", "command: ['true']\nplacement: {nodeName: elsewhere}"))
    env.wait_status("pinned", lambda s: s.get("reason") == "Unschedulable", what="pinned is Unschedulable")
    why = _why(env, "pinned")
    assert why.startswith("1st of 1 in the global queue; no node fits: 0/1 nodes are available"), why
    assert "didn't match nodeName" in why


def test_global_limit_backoff_and_suspension_said(env):
    go = env.root / "go"
    env.controller()
    env.apply("hold.yaml", docs(pool_yaml("global", 1), job_yaml("hold", held_until(go))))
    env.wait_phase("hold", "Running")
    env.apply(
        "others.yaml",
        docs(
            job_yaml("next", "command: ['true']"),
            job_yaml("paused", "command: ['true']\nsuspend: true"),
        ),
    )
    env.wait_phase("next", "Queued")
    env.wait_phase("paused", "Suspended")
    assert _why(env, "next") == "1st of 1 in the global queue; the global limit is full (1/1 slots in use, 1 needed)"
    assert _why(env, "paused") == "suspended: resume it to go on"

    go.touch()
    env.wait_completed("hold", "next")
    env.apply("flaky.yaml", job_yaml("flaky", "command: ['false']\nretry: {limit: 2, backoff: {delay: 1h}}"))
    status = env.wait_phase("flaky", "Backoff")
    assert _why(env, "flaky") == f"backing off after run 1: runs again at {status['nextRunAt']}"
    assert _message_column(env)["flaky"] == _why(env, "flaky")
