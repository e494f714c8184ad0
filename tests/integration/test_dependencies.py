"""dependsOn: outcome sets (Succeeded, [Failed], Finished), receipts, and a dependency that
can never satisfy an edge aborting the dependent without starting it."""

from __future__ import annotations

from .conftest import STAMP, docs, epoch, job_yaml


def test_dependency_outcomes_and_receipts(env):
    manifest = env.write(
        "deps.yaml",
        docs(
            job_yaml("good", "command: ['true']"),
            job_yaml("bad", "command: [sh, -c, 'exit 3']"),
            job_yaml("on-good", "command: ['true']\ndependsOn: [good]"),
            job_yaml("on-bad-finished", "command: ['true']\ndependsOn: [{job: bad, outcomes: [Finished]}]"),
            job_yaml("on-bad-failed", "command: ['true']\ndependsOn: [{job: bad, outcomes: [Failed]}]"),
            job_yaml("on-bad", "command: ['true']\ndependsOn: [bad]"),
            job_yaml("on-good-failed", "command: ['true']\ndependsOn: [{job: good, outcomes: [Failed, TimedOut]}]"),
            job_yaml("after-aborted", "command: ['true']\ndependsOn: [on-bad, good]"),
        ),
    )
    result = env.up(manifest)
    assert result.code == 1, result.stderr  # not everything succeeded
    jobs = env.jobs()
    outcome = {n: (j["status"]["outcome"], j["status"]["reason"]) for n, j in jobs.items()}
    assert outcome == {
        "good": ("Succeeded", "Succeeded"),
        "bad": ("Failed", "BackoffLimitExceeded"),
        "on-good": ("Succeeded", "Succeeded"),
        "on-bad-finished": ("Succeeded", "Succeeded"),
        "on-bad-failed": ("Succeeded", "Succeeded"),
        "on-bad": ("Aborted", "DependencyUnsatisfied"),
        "on-good-failed": ("Aborted", "DependencyUnsatisfied"),
        "after-aborted": ("Aborted", "DependencyUnsatisfied"),
    }

    # a dependent starts only after its dependency completed
    for name, dep in [("on-good", "good"), ("on-bad-finished", "bad"), ("on-bad-failed", "bad")]:
        assert (
            epoch(jobs[name]["status"]["runs"][0]["startedAt"]) >= epoch(jobs[dep]["status"]["completionTime"]) - STAMP
        )

    # the aborted ones never started: no run records, no run folder
    for name in ("on-bad", "on-good-failed", "after-aborted"):
        assert not jobs[name]["status"].get("runs"), name
        assert not list((env.store.state_dir / "runs").glob(f"{name}.*")), name
        assert "startTime" not in jobs[name]["status"]
    assert "bad" in jobs["on-bad"]["status"]["message"] and "Failed" in jobs["on-bad"]["status"]["message"]

    # receipts: what satisfied (or broke) each edge
    def receipt(name: str, dep: str) -> dict:
        (r,) = [r for r in jobs[name]["status"]["dependencies"] if r["job"] == dep]
        return r

    for name, dep, satisfied in [
        ("on-good", "good", True),
        ("on-bad-finished", "bad", True),
        ("on-bad-failed", "bad", True),
        ("on-bad", "bad", False),
        ("on-good-failed", "good", False),
        ("after-aborted", "on-bad", False),
    ]:
        r = receipt(name, dep)
        assert r["uid"] == jobs[dep]["metadata"]["uid"], (name, r)
        assert r["revision"] == 1 and r["outcome"] == jobs[dep]["status"]["outcome"], (name, r)
        assert r["satisfied"] is satisfied, (name, r)
        assert epoch(r["observedAt"]) >= epoch(jobs[dep]["status"]["completionTime"]) - STAMP, (name, r)


def test_a_job_is_stored_as_the_first_look_finds_it_waiting_for_its_dependencies(store_url, tmp_path):
    """apply stores a job with dependencies already waiting for them (reason, message, no
    receipt), so the controller's first look, while none has completed, writes nothing; the
    look after one completes records its receipt and waits for the rest."""
    from reconciler.reads import job_statuses
    from reconciler.store import repository as repo
    from tests.helpers import wait_until
    from tests.integration.wired import wired_controller

    manifests = docs(
        job_yaml("first", "command: ['true']"),
        job_yaml("second", "command: ['true']\nsuspend: true"),
        job_yaml("after", "command: ['true']\ndependsOn: [first, second]"),
    )

    def stored():
        with wired.store.read() as session:
            obj = repo.get(session, kind="Job", name="after")
        assert obj is not None
        return obj.resource_version, obj.status

    with wired_controller(store_url, tmp_path, manifests) as wired:
        version, status = stored()
        assert (status["phase"], status["reason"], status["message"]) == (
            "Waiting",
            "WaitingForDependencies",
            "waiting for first, second",
        )
        wired.jobs("after")
        assert stored() == (version, status)  # the first look found what apply stored

        def first_completed() -> bool:  # its run must exit, which takes what it takes
            wired.jobs("first")
            return job_statuses(wired.store, ["first"])["first"].get("phase") == "Completed"

        wait_until(first_completed, message="first completed")
        wired.jobs("after")
        version, status = stored()
        assert status["message"] == "waiting for second"
        assert [(r["job"], r["satisfied"]) for r in status["dependencies"]] == [("first", True)]


def test_a_waiting_job_whose_dependencies_changed_is_judged_on_its_new_ones(store_url, tmp_path):
    """The loop asks for a waiting job's dependencies together with the job, by the names it
    last saw it wait for (one round trip on PostgreSQL). A job whose dependencies were changed
    meanwhile is judged on its new ones, read afresh, not on the states read by the old names."""
    from pathlib import Path

    from reconciler.apply import apply_manifests
    from reconciler.manifests import parse_text
    from reconciler.reads import job_statuses
    from tests.helpers import wait_until
    from tests.integration.wired import wired_controller

    manifests = docs(
        job_yaml("never", "command: ['true']\nsuspend: true"),
        job_yaml("done", "command: ['true']"),
        job_yaml("after", "command: ['true']\ndependsOn: [never]"),
    )
    with wired_controller(store_url, tmp_path, manifests) as wired:
        wired.jobs("after")  # seen waiting for `never`

        def done_completed() -> bool:
            wired.jobs("done")
            return job_statuses(wired.store, ["done"])["done"].get("phase") == "Completed"

        wait_until(done_completed, message="done completed")
        changed, problems = parse_text(
            docs(job_yaml("after", "command: ['true']\ndependsOn: [done]")), "a.yaml", Path(tmp_path)
        )
        assert not problems
        apply_manifests(wired.store, changed)
        for _ in range(3):  # the new revision, then its look at the dependencies
            wired.jobs("after")
        status = job_statuses(wired.store, ["after"])["after"]
        assert [(r["job"], r["satisfied"]) for r in status.get("dependencies", [])] == [("done", True)], status
        assert status["phase"] != "Waiting", status
