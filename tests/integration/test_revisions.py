"""Revisions: a changed spec runs again (and so do its consumers), an unchanged one runs
nothing; an active job's spec change is a conflict unless --force; rerun [--downstream]."""

from __future__ import annotations

import psutil

from .conftest import STAMP, docs, epoch, job_yaml


def _runs(job: dict) -> list[tuple[int, int]]:
    return [(r["number"], r["revision"]) for r in job["status"]["runs"]]


def _pipeline(version: str) -> str:
    return docs(
        job_yaml("base", f"command: [echo, {version}]"), job_yaml("child", "command: [echo, child]\ndependsOn: [base]")
    )


def test_changed_spec_runs_again_with_its_dependents(env):
    manifest = env.write("pipeline.yaml", _pipeline("v1"))
    env.controller()
    env.ok("apply", "-f", str(manifest))
    env.wait_completed()
    # re-applying the same manifest changes nothing and runs nothing
    assert env.ok("apply", "-f", str(manifest)).stdout.splitlines() == [
        "job.reconciler.dev/base unchanged",
        "job.reconciler.dev/child unchanged",
    ]

    env.write("pipeline.yaml", _pipeline("v2"))
    assert env.ok("apply", "-f", str(manifest)).stdout.splitlines() == [
        "job.reconciler.dev/base configured",
        "job.reconciler.dev/child unchanged",
    ]
    env.wait_status("child", lambda s: s.get("revision") == 2 and s.get("phase") == "Completed", what="child rev 2")
    jobs = env.jobs()
    base, child = jobs["base"], jobs["child"]
    assert (base["metadata"]["generation"], base["status"]["revision"], base["status"]["outcome"]) == (
        2,
        2,
        "Succeeded",
    )
    assert _runs(base) == [(1, 1), (2, 2)]  # the unchanged apply ran nothing
    assert (child["metadata"]["generation"], child["status"]["revision"], child["status"]["outcome"]) == (
        1,
        2,
        "Succeeded",
    )
    assert _runs(child) == [(1, 1), (2, 2)]
    assert epoch(child["status"]["runs"][1]["startedAt"]) >= epoch(base["status"]["runs"][1]["finishedAt"]) - STAMP
    (receipt,) = child["status"]["dependencies"]
    assert (receipt["revision"], receipt["outcome"], receipt["satisfied"]) == (2, "Succeeded", True)
    assert (env.run_dir("base", 1) / "stdout").read_text() == "v1\n"
    assert (env.run_dir("base", 2) / "stdout").read_text() == "v2\n"


def test_wait_does_not_answer_from_an_outdated_completion(env):
    """With no controller running, a job whose spec changed after it completed (and its
    dependent, which consumed the old revision) is not Succeeded yet: `wait` waits."""
    manifest = env.write("pipeline.yaml", _pipeline("v1"))
    assert env.up(manifest).code == 0
    env.write("pipeline.yaml", _pipeline("v2"))
    env.ok("apply", "-f", str(manifest))
    result = env.cli("wait", "job/base", "job/child", "--for", "condition=Succeeded", "--timeout", "500ms")
    assert result.code == 1 and "timed out" in result.stderr and "base, child" in result.stderr, result


def test_up_after_a_spec_change_converges_the_new_revision(env):
    manifest = env.write("pipeline.yaml", _pipeline("v1"))
    assert env.up(manifest).code == 0
    # a busy store: other jobs waiting for something that is not there yet
    env.apply(
        "others.yaml",
        docs(
            job_yaml("gate", "command: ['true']\nwaitFor: {conditions: [{path: /nonexistent/x}]}"),
            *(job_yaml(f"other-{i}", "command: ['true']\ndependsOn: [gate]") for i in range(60)),
        ),
    )
    env.write("pipeline.yaml", _pipeline("v2"))
    assert env.up(manifest).code == 0
    jobs = env.jobs()
    assert [(r["number"], r["revision"], r.get("outcome")) for r in jobs["base"]["status"]["runs"]] == [
        (1, 1, "Succeeded"),
        (2, 2, "Succeeded"),
    ]
    assert (jobs["child"]["status"]["revision"], jobs["child"]["status"]["phase"]) == (2, "Completed")


def test_changing_an_active_job_needs_force(env):
    env.controller()
    env.apply("long.yaml", job_yaml("long", "command: [sleep, '60']"))
    running = env.wait_status("long", lambda s: s.get("phase") == "Running" and s.get("runs"), what="running")
    pid = running["runs"][0]["pid"]

    env.write("long.yaml", job_yaml("long", "command: [echo, revised]"))
    refused = env.cli("apply", "-f", str(env.root / "long.yaml"))
    assert refused.code == 4, refused
    assert "--force" in refused.stderr
    assert env.status("long")["phase"] == "Running" and env.peek("long")["metadata"]["generation"] == 1
    # diff says the same; diff --force previews what apply --force would change, and changes nothing
    assert env.cli("diff", "-f", str(env.root / "long.yaml")).code == 4
    preview = env.cli("diff", "--force", "-f", str(env.root / "long.yaml"))
    assert preview.code == 1 and "+  - revised" in preview.stdout, preview
    assert env.status("long")["phase"] == "Running" and env.peek("long")["metadata"]["generation"] == 1

    assert "configured" in env.ok("apply", "-f", str(env.root / "long.yaml"), "--force").stdout
    env.wait_completed("long")
    status = env.get_job("long")["status"]
    assert (status["outcome"], status["revision"]) == ("Succeeded", 2)
    first, second = status["runs"]
    assert (first["number"], first["revision"], first["outcome"]) == (1, 1, "Cancelled")
    assert (second["number"], second["revision"], second["outcome"]) == (2, 2, "Succeeded")
    assert epoch(second["startedAt"]) >= epoch(first["finishedAt"]) - STAMP
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert (env.run_dir("long", 2) / "stdout").read_text() == "revised\n"


def test_rerun_with_and_without_downstream(env):
    env.controller()
    env.apply(
        "chain.yaml",
        docs(
            job_yaml("a", "command: ['true']"),
            job_yaml("b", "command: ['true']\ndependsOn: [a]"),
            job_yaml("c", "command: ['true']\ndependsOn: [b]"),
        ),
    )
    env.wait_completed()
    assert "rerun requested" in env.ok("rerun", "job/a").stdout
    env.wait_status("a", lambda s: s.get("revision") == 2 and s.get("phase") == "Completed", what="a rerun")
    assert env.ok("rerun", "--downstream", "job/a").code == 0
    env.wait_status("a", lambda s: s.get("revision") == 3 and s.get("phase") == "Completed", what="a rerun downstream")
    env.wait_status("c", lambda s: s.get("revision") == 2 and s.get("phase") == "Completed", what="c after b")
    jobs = env.jobs()
    assert _runs(jobs["a"]) == [(1, 1), (2, 2), (3, 3)]
    # plain rerun left b and c alone; --downstream ran each once more, after its dependency
    assert _runs(jobs["b"]) == [(1, 1), (2, 2)]
    assert _runs(jobs["c"]) == [(1, 1), (2, 2)]
    assert (
        epoch(jobs["b"]["status"]["runs"][1]["startedAt"])
        >= epoch(jobs["a"]["status"]["runs"][2]["finishedAt"]) - STAMP
    )
    assert (
        epoch(jobs["c"]["status"]["runs"][1]["startedAt"])
        >= epoch(jobs["b"]["status"]["runs"][1]["finishedAt"]) - STAMP
    )
    assert jobs["b"]["status"]["dependencies"][0]["revision"] == 3
    assert all(j["status"]["outcome"] == "Succeeded" for j in jobs.values())


def test_a_dependency_and_its_dependent_changed_at_once_run_once_in_order(env):
    """Both specs change in one apply, the dependent listed (and so looked at) first: it must
    not run on the dependency's old completion and then again after its new run."""

    def pipeline(version: str) -> str:
        return docs(
            job_yaml("child", f"command: [echo, child-{version}]\ndependsOn: [base]"),
            job_yaml("base", f"command: [echo, {version}]"),
        )

    env.controller()
    env.apply("pipeline.yaml", pipeline("v1"))
    env.wait_completed()
    env.apply("pipeline.yaml", pipeline("v2"))
    for name in ("base", "child"):
        env.wait_status(name, lambda s: s.get("revision") == 2 and s.get("phase") == "Completed", what="rev 2")
    jobs = env.jobs()
    assert _runs(jobs["base"]) == [(1, 1), (2, 2)]
    assert _runs(jobs["child"]) == [(1, 1), (2, 2)]
    assert (
        epoch(jobs["child"]["status"]["runs"][1]["startedAt"])
        >= epoch(jobs["base"]["status"]["runs"][1]["finishedAt"]) - STAMP
    )
    assert jobs["child"]["status"]["dependencies"][0]["revision"] == 2
