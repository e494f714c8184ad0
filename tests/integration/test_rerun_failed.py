"""`rerun --failed [-l SEL]`: every completed job whose outcome is not Succeeded runs again, in
one request, and what depends on it runs again after it, once; `rerun -l SEL`; usage errors."""

from __future__ import annotations

from .conftest import STAMP, docs, epoch, job_yaml


def _pipeline(flag) -> str:
    """z-build fails, and a-test (which needs it to succeed) ends Aborted; b-report takes any
    outcome of z-build and succeeds; slow times out; lint fails on its own; ok succeeds. Each
    failing job succeeds once `flag` exists. The dependent's name sorts before its
    dependency's, so no order of looking at them hides a wrong one."""
    return docs(
        job_yaml("a-test", "command: ['true']\ndependsOn: [z-build]", "{team: b}"),
        job_yaml("z-build", f"shell: \"test -e '{flag}'\"", "{team: a}"),
        job_yaml("b-report", "command: ['true']\ndependsOn: [{job: z-build, outcomes: [Finished]}]", "{team: b}"),
        job_yaml("slow", f"shell: \"test -e '{flag}' || sleep 30\"\ntimeout: 300ms", "{team: b}"),
        job_yaml("lint", f"shell: \"test -e '{flag}'\"", "{team: b}"),
        job_yaml("ok", "command: ['true']", "{team: a}"),
    )


def _runs(job: dict) -> list[tuple[int, int, str]]:
    return [(r["number"], r["revision"], r.get("outcome")) for r in job["status"].get("runs", [])]


def _state(job: dict) -> tuple[int, str]:
    return job["status"]["revision"], job["status"]["outcome"]


def _wait_revision(env, revision: int, *names: str) -> None:
    for name in names:
        env.wait_status(
            name,
            lambda s: s.get("revision") == revision and s.get("phase") == "Completed",
            what=f"revision {revision} completed",
        )


def test_rerun_failed_reruns_the_failed_and_their_dependents(env):
    flag = env.root / "fixed"
    env.controller()
    env.apply("pipeline.yaml", _pipeline(flag))
    env.wait_completed()
    before = env.jobs()
    assert {n: j["status"]["outcome"] for n, j in before.items()} == {
        "z-build": "Failed",
        "a-test": "Aborted",
        "b-report": "Succeeded",
        "slow": "TimedOut",
        "lint": "Failed",
        "ok": "Succeeded",
    }
    assert _runs(before["a-test"]) == []  # it never started

    flag.touch()
    result = env.ok("rerun", "--failed")
    assert result.stdout.splitlines() == [
        "job.reconciler.dev/a-test rerun requested",
        "job.reconciler.dev/lint rerun requested",
        "job.reconciler.dev/slow rerun requested",
        "job.reconciler.dev/z-build rerun requested",
    ]
    # the request is the annotation, one token for all of them, and asks for the dependents too
    tokens = {n: env.peek(n)["metadata"]["annotations"].get("reconciler.dev/rerun") for n in before}
    assert tokens["ok"] is None and tokens["b-report"] is None
    assert len({tokens[n] for n in ("a-test", "lint", "slow", "z-build")}) == 1
    assert tokens["z-build"].endswith(";downstream")

    _wait_revision(env, 2, "z-build", "a-test", "b-report", "slow", "lint")
    jobs = env.jobs()
    assert _state(jobs["z-build"]) == (2, "Succeeded")
    assert _state(jobs["lint"]) == (2, "Succeeded")
    assert _state(jobs["slow"]) == (2, "Succeeded")
    # the dependent that reran with its dependency ran once, after the dependency's new run,
    # and was never decided on the old outcome of it (no second revision, no Aborted again)
    assert _state(jobs["a-test"]) == (2, "Succeeded")
    assert _runs(jobs["a-test"]) == [(1, 2, "Succeeded")]
    build_end = epoch(jobs["z-build"]["status"]["runs"][1]["finishedAt"])
    assert epoch(jobs["a-test"]["status"]["runs"][0]["startedAt"]) >= build_end - STAMP
    (receipt,) = jobs["a-test"]["status"]["dependencies"]
    assert (receipt["revision"], receipt["outcome"]) == (2, "Succeeded")
    # a dependent that succeeded follows its rerun dependency (downstream), once
    assert _runs(jobs["b-report"]) == [(1, 1, "Succeeded"), (2, 2, "Succeeded")]
    assert epoch(jobs["b-report"]["status"]["runs"][1]["startedAt"]) >= build_end - STAMP
    # what had succeeded and depends on nothing rerun is left alone
    assert _runs(jobs["ok"]) == [(1, 1, "Succeeded")]

    # nothing failed any more: said so, exit 0, nothing requested
    again = env.ok("rerun", "--failed")
    assert again.stdout == "" and "No failed jobs found" in again.stderr


def test_rerun_failed_with_a_selector(env):
    flag = env.root / "fixed"
    env.controller()
    env.apply("pipeline.yaml", _pipeline(flag))
    env.wait_completed()
    flag.touch()
    # team=a: z-build only of the failed ones; a-test (team=b) follows it as its dependent
    assert env.ok("rerun", "--failed", "-l", "team=a").stdout.splitlines() == [
        "job.reconciler.dev/z-build rerun requested"
    ]
    _wait_revision(env, 2, "z-build", "a-test", "b-report")
    jobs = env.jobs()
    assert _state(jobs["z-build"]) == (2, "Succeeded")
    assert _state(jobs["a-test"]) == (2, "Succeeded") and _runs(jobs["a-test"]) == [(1, 2, "Succeeded")]
    assert _state(jobs["lint"]) == (1, "Failed") and _state(jobs["slow"]) == (1, "TimedOut")
    assert env.ok("rerun", "--failed", "-l", "team=nobody").stderr.strip() == "No failed jobs found."


def test_rerun_by_selector_and_usage_errors(env):
    env.controller()
    env.apply(
        "jobs.yaml",
        docs(
            job_yaml("one", "command: ['true']", "{set: s}"),
            job_yaml("two", "command: ['true']", "{set: s}"),
            job_yaml("other", "command: ['true']"),
        ),
    )
    env.wait_completed()
    assert env.ok("rerun", "-l", "set=s").stdout.splitlines() == [
        "job.reconciler.dev/one rerun requested",
        "job.reconciler.dev/two rerun requested",
    ]
    _wait_revision(env, 2, "one", "two")
    assert env.jobs()["other"]["status"]["revision"] == 1

    failed_and_names = env.cli("rerun", "--failed", "job/one")
    assert failed_and_names.code == 2 and failed_and_names.stdout == "", failed_and_names
    assert env.cli("rerun").code == 2
    assert env.cli("rerun", "-l", "set=s", "job/one").code == 2
    assert "rerun requested" in env.ok("rerun", "job/other").stdout  # by name, as before
