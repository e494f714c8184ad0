"""Stopping a live run on request (API.md sections 2 and 3): cancel, suspend/resume,
delete, and apply --force of a changed spec. Each stops the whole process tree before the
job moves on, and releases the admission. Real controller, real processes, real SQLite."""

from __future__ import annotations

from reconciler.api.meta import to_epoch
from tests.crash.harness import job, pool, read_pids
from tests.helpers import wait_until


# a shell that starts two grandchildren and records every pid of the tree, then waits
def tree(pids) -> str:
    return f"sleep 60 & echo $! >> {pids}; sleep 60 & echo $! >> {pids}; echo $$ >> {pids}; wait"


def test_cancel_stops_the_process_tree(env, controller, tmp_path):
    pids = tmp_path / "tree.pids"
    env.apply(job("victim", tree(pids), stopGracePeriod="1s", retry={"limit": 3}))
    procs = read_pids(pids, 3)
    env.wait_running("victim")

    assert "cancel requested" in env.cli("cancel", "job/victim").stdout
    status = env.wait_phase("victim", "Completed")
    assert [p for p in procs if p.alive()] == [], "Completed while part of the process tree is alive"
    assert (status["outcome"], status["reason"]) == ("Cancelled", "Cancelled")
    assert [(r["number"], r["outcome"]) for r in status["runs"]] == [(1, "Cancelled")], "a cancelled job is not retried"
    assert env.admissions() == [] and env.queue() == []
    assert env.get_json("victim")["status"]["outcome"] == "Cancelled"


def test_suspend_releases_the_slot_and_resume_keeps_the_queue_position(env, controller, tmp_path):
    release = tmp_path / "release"
    a_pid = tmp_path / "a.pid"
    env.apply(pool("one", 1))
    env.apply(job("first", f"echo $$ >> {a_pid}; exec sleep 60", pool="one", stopGracePeriod="1s"))
    [a1] = read_pids(a_pid, 1)
    eligible = env.wait_running("first")["eligibleAt"]
    env.apply(job("second", f"while [ ! -e {release} ]; do sleep 0.05; done", pool="one"))
    env.wait_status("second", lambda s: s.get("phase") == "Queued" and s.get("eligibleAt"))

    # suspend: the run is stopped, the slot goes to the next in line
    assert "suspended" in env.cli("suspend", "job/first").stdout
    suspended = env.wait_phase("first", "Suspended")
    assert not a1.alive(), "Suspended while its process is alive"
    assert [r["outcome"] for r in suspended["runs"]] == ["Cancelled"]
    assert "admission" not in suspended or suspended["admission"] is None
    env.wait_running("second")
    assert [a.job_name for a in env.admissions()] == ["second"], "the suspended job still holds its slot"

    # a younger job queues behind it; resume puts it back at its old position
    env.apply(job("third", "exit 0", pool="one"))
    third_eligible = env.wait_status("third", lambda s: s.get("phase") == "Queued" and s.get("eligibleAt"))[
        "eligibleAt"
    ]
    assert to_epoch(third_eligible) > to_epoch(eligible)
    assert "resumed" in env.cli("resume", "job/first").stdout
    resumed = env.wait_phase("first", "Queued")
    assert resumed["eligibleAt"] == eligible, "resume must keep the queue position (eligibleAt)"
    queue = env.queue()
    assert [q.job_name for q in queue] == ["first", "third"], [(q.job_name, q.eligible_at) for q in queue]

    # when the slot frees up, the resumed job goes first
    release.touch()
    env.wait_phase("second", "Completed")
    env.wait_running("first", run=2)
    [a2] = read_pids(a_pid, 2, skip=1)
    assert env.status("third")["phase"] == "Queued"
    assert [a.job_name for a in env.admissions()] == ["first"]

    env.cli("cancel", "job/first")
    done = env.wait_completed(["first", "second", "third"])
    assert not a2.alive()
    assert [(n, s["outcome"]) for n, s in done.items()] == [
        ("first", "Cancelled"),
        ("second", "Succeeded"),
        ("third", "Succeeded"),
    ]
    assert [r["number"] for r in done["first"]["runs"]] == [1, 2]
    assert env.admissions() == [] and env.queue() == []


def test_delete_while_running_stops_the_tree_and_removes_the_job(env, controller, tmp_path):
    pids = tmp_path / "tree.pids"
    env.apply(job("doomed", tree(pids), stopGracePeriod="1s"))
    procs = read_pids(pids, 3)
    env.wait_running("doomed")

    env.cli("delete", "job", "doomed")
    wait_until(lambda: env.obj("doomed") is None, 30, message="doomed removed")
    assert [p for p in procs if p.alive()] == [], "the job was removed while part of its process tree is alive"
    assert env.cli("get", "job", "doomed", ok=False).code == 3
    assert env.admissions() == [] and env.queue() == []


def test_apply_force_stops_the_old_run_and_runs_the_new_revision(env, controller, tmp_path):
    old_pid, out = tmp_path / "old.pid", tmp_path / "out"
    env.apply(job("changing", f"echo $$ > {old_pid}; exec sleep 60", stopGracePeriod="1s"))
    [old] = read_pids(old_pid, 1)
    env.wait_running("changing")

    new = job("changing", f"echo revision $RECONCILER_REVISION > {out}", stopGracePeriod="1s")
    conflict = env.apply(new, ok=False)
    assert conflict.code == 4, (conflict.stdout, conflict.stderr)
    assert old.alive(), "a refused apply must not touch the running run"

    assert "configured" in env.apply(new, force=True).stdout
    status = env.wait_status("changing", lambda s: s.get("phase") == "Completed" and s.get("revision") == 2)
    assert not old.alive()
    assert status["outcome"] == "Succeeded"
    runs = [(r["number"], r["revision"], r["outcome"]) for r in status["runs"]]
    assert runs == [(1, 1, "Cancelled"), (2, 2, "Succeeded")], runs
    assert out.read_text().strip() == "revision 2"
    assert env.admissions() == [] and env.queue() == []


def test_delete_while_queued_gives_up_its_place_in_line(env, controller):
    env.apply(pool("one", 1))
    env.apply(job("holder", "sleep 60", pool="one", stopGracePeriod="1s"))
    env.wait_running("holder")
    env.apply(job("deleted", "exit 0", pool="one"))
    env.wait_phase("deleted", "Queued")

    env.cli("delete", "job", "deleted")
    wait_until(lambda: env.obj("deleted") is None, 30, message="deleted removed")
    wait_until(lambda: "deleted" not in [q.job_name for q in env.queue()], 5, message="the queue row goes with the job")
    env.apply(job("later", "exit 0", pool="one"))
    env.wait_phase("later", "Queued")
    env.cli("cancel", "job/holder")
    env.wait_phase("holder", "Completed")

    status = env.wait_phase("later", "Completed", timeout=15)
    assert status["outcome"] == "Succeeded"
    assert env.admissions() == [] and env.queue() == []


def labelled(manifest: dict, **labels: str) -> dict:
    manifest["metadata"]["labels"] = labels
    return manifest


def test_controls_select_jobs_by_label(env, controller):
    for name, team in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        env.apply(labelled(job(name, "exec sleep 60", stopGracePeriod="1s"), team=team))
    for name in ("a1", "a2", "b1"):
        env.wait_running(name)

    suspended = env.cli("suspend", "-l", "team=a").stdout.splitlines()
    assert suspended == ["job.reconciler.dev/a1 suspended", "job.reconciler.dev/a2 suspended"], suspended
    env.wait_phase("a1", "Suspended")
    env.wait_phase("a2", "Suspended")
    assert env.status("b1")["phase"] == "Running", "a job outside the selector was touched"

    assert env.cli("resume", "-l", "team=a").stdout.splitlines() == [
        "job.reconciler.dev/a1 resumed",
        "job.reconciler.dev/a2 resumed",
    ]
    env.wait_running("a1", run=2)
    env.wait_running("a2", run=2)

    cancelled = env.cli("cancel", "-l", "team in (a, b)").stdout.splitlines()
    assert [line.split()[0] for line in cancelled] == [f"job.reconciler.dev/{n}" for n in ("a1", "a2", "b1")]
    done = env.wait_completed(["a1", "a2", "b1"])
    assert {n: s["outcome"] for n, s in done.items()} == dict.fromkeys(("a1", "a2", "b1"), "Cancelled")

    nothing = env.cli("cancel", "-l", "team=nobody")
    assert (nothing.stdout, nothing.stderr.strip()) == ("", "No resources found.")
    for args in (("cancel",), ("suspend", "job/a1", "-l", "team=a"), ("resume", "-l", "team in (a")):
        refused = env.cli(*args, ok=False)
        assert refused.code == 2 and refused.stderr.startswith("error:"), (args, refused.stderr)


DEAF = "trap '' TERM; sleep 300"  # ignores SIGTERM (its sleep too): it stops only at the grace period's SIGKILL


def test_requests_made_while_a_run_stops_are_not_lost(env, controller):
    """A delete, a resume or a cancel given while a run is stopping for another request is
    written while the job is Stopping; once the stop is over the job goes where the last
    word says (it stayed Terminating, or Suspended with suspend: false, for good)."""
    for name in ("cancelled-then-deleted", "suspended-then-resumed", "suspended-then-cancelled"):
        env.apply(job(name, DEAF, stopGracePeriod="3s"))
        env.wait_running(name)
    env.cli("cancel", "job/cancelled-then-deleted")
    env.cli("suspend", "job/suspended-then-resumed", "job/suspended-then-cancelled")
    for name in ("cancelled-then-deleted", "suspended-then-resumed", "suspended-then-cancelled"):
        env.wait_phase(name, "Stopping")
    env.cli("delete", "job", "cancelled-then-deleted")
    env.cli("resume", "job/suspended-then-resumed")
    env.cli("cancel", "job/suspended-then-cancelled")
    assert env.status("suspended-then-cancelled")["phase"] == "Stopping", "the grace period is not over yet"

    wait_until(lambda: env.obj("cancelled-then-deleted") is None, 30, message="the deleted job removed")
    resumed = env.wait_running("suspended-then-resumed", run=2)
    assert [r["outcome"] for r in resumed["runs"][:1]] == ["Cancelled"]
    cancelled = env.wait_phase("suspended-then-cancelled", "Completed")
    assert (cancelled["outcome"], cancelled["reason"]) == ("Cancelled", "Cancelled")
    env.cli("delete", "job", "suspended-then-resumed")
    wait_until(lambda: env.obj("suspended-then-resumed") is None, 30, message="the resumed job removed")
