"""`run` (one-off jobs without a manifest) and `wait --for condition=...`."""

from __future__ import annotations

from .conftest import STAMP, epoch


def test_run_and_wait(env):
    marker = env.root / "failed-once"
    assert env.ok("run", "--", "true").stdout.strip() == "job.reconciler.dev/job-1 created"
    assert (
        env.ok("run", "--name", "after", "--after-success", "job-1", "--", "echo", "after").stdout.strip()
        == "job.reconciler.dev/after created"
    )
    # --wait reconciles in the foreground until its job completes: 0 when it succeeded
    flaky = env.cli(
        "run",
        "--wait",
        "--after-success",
        "after",
        "--retries",
        "2",
        "--retry-delay",
        "300ms",
        "--",
        "sh",
        "-c",
        f"if [ -e '{marker}' ]; then echo ok; else touch '{marker}'; exit 1; fi",
    )
    assert flaky.code == 0, flaky.stderr
    assert flaky.stdout.splitlines()[0] == "job.reconciler.dev/job-2 created"  # then progress lines
    # ... and 1 when it did not
    failing = env.cli("run", "--wait", "--", "sh", "-c", "exit 3")
    assert failing.code == 1 and failing.stdout.splitlines()[0] == "job.reconciler.dev/job-3 created", failing

    jobs = env.jobs()
    assert jobs["job-1"]["status"]["outcome"] == "Succeeded"
    assert jobs["after"]["status"]["outcome"] == "Succeeded"
    (receipt,) = jobs["after"]["status"]["dependencies"]
    assert (receipt["job"], receipt["outcome"], receipt["satisfied"]) == ("job-1", "Succeeded", True)
    assert (
        epoch(jobs["after"]["status"]["runs"][0]["startedAt"])
        >= epoch(jobs["job-1"]["status"]["completionTime"]) - STAMP
    )
    runs = jobs["job-2"]["status"]["runs"]
    assert [r["exitCode"] for r in runs] == [1, 0]
    assert epoch(runs[1]["startedAt"]) - epoch(runs[0]["finishedAt"]) >= 0.3 - STAMP
    assert epoch(runs[0]["startedAt"]) >= epoch(jobs["after"]["status"]["completionTime"]) - STAMP
    assert (jobs["job-3"]["status"]["outcome"], jobs["job-3"]["status"]["runs"][0]["exitCode"]) == ("Failed", 3)
    assert (env.run_dir("job-2", 2) / "stdout").read_text() == "ok\n"

    # wait: 0 when met, 1 when it can no longer be met, 1 on timeout
    env.ok("run", "--name", "idle", "--", "true")  # no controller runs now: it stays Waiting
    met, never, completed, timed_out, nothing, by_label = env.cli_all(
        ("wait", "job/job-2", "job/after", "--for", "condition=Succeeded", "--timeout", "5s"),
        ("wait", "job/job-3", "--for", "condition=Succeeded", "--timeout", "30s"),
        ("wait", "job/job-3", "--for", "condition=Completed", "--timeout", "5s"),
        ("wait", "job/idle", "--for", "condition=Succeeded", "--timeout", "300ms"),
        ("wait", "-l", "team=nobody", "--for", "condition=Completed", "--timeout", "5s"),
        ("wait", "-l", "team!=nobody", "--for", "condition=Completed", "--timeout", "300ms"),
    )
    assert met.code == 0, met
    assert never.code == 1 and "job-3 can no longer be Succeeded" in never.stderr, never
    assert completed.code == 0, completed
    assert timed_out.code == 1 and "timed out" in timed_out.stderr, timed_out
    # a selector that matches no job is not a vacuous success (as kubectl: an error, exit 1)
    assert nothing.code == 1 and "error: no matching jobs found (-l team=nobody)" in nothing.stderr, nothing
    assert by_label.code == 1 and "idle" in by_label.stderr, by_label  # it matched, and idle waits


def test_wait_follows_a_controller(env):
    env.controller()
    env.ok("run", "--name", "slow", "--", "sleep", "0.3")
    env.ok("run", "--name", "broken", "--after-finish", "slow", "--", "sh", "-c", "exit 2")
    assert env.cli("wait", "job/slow", "--for", "condition=Succeeded", "--timeout", "60s").code == 0
    result = env.cli("wait", "job/broken", "--for", "condition=Succeeded", "--timeout", "60s")
    assert result.code == 1 and "can no longer be Succeeded" in result.stderr
    status = env.status("broken")
    assert status["outcome"] == "Failed" and status["dependencies"][0]["outcome"] == "Succeeded"
