"""A job the controller read or wrote is not read again while no other writer has committed
(`Store.epoch`, controller/known.py): on PostgreSQL each read is a round trip. Another
writer's commit ends that, and the controller sees what it wrote."""

from __future__ import annotations

import pytest

from reconciler.commands import set_suspend
from reconciler.reads import job_statuses
from reconciler.store import repository as repo
from tests.integration.wired import wired_controller

from .conftest import docs, job_yaml


@pytest.fixture
def reads(monkeypatch):
    """The names of the jobs the controller reads one by one (a spy: the reads still happen)."""
    seen: list[str] = []
    get, get_with_statuses = repo.get, repo.get_with_statuses

    def counted_get(session, *, kind, name):
        if kind == "Job":
            seen.append(name)
        return get(session, kind=kind, name=name)

    def counted_with_statuses(session, *, kind, name, names):
        if kind == "Job":
            seen.append(name)
        return get_with_statuses(session, kind=kind, name=name, names=names)

    monkeypatch.setattr(repo, "get", counted_get)
    monkeypatch.setattr(repo, "get_with_statuses", counted_with_statuses)
    return seen


def held_by(absent) -> str:
    """A job that waits for a file nobody makes: each look at it writes nothing new."""
    return f"command: ['true']\nwaitFor: {{conditions: [{{path: '{absent}', type: file}}]}}"


def test_a_kept_job_is_not_read_again_until_another_writer_commits(store_url, tmp_path, reads):
    manifests = docs(job_yaml("held", held_by(tmp_path / "never")))
    with wired_controller(store_url, tmp_path, manifests) as wired:

        def look(name: str) -> str:
            reads.clear()
            with wired.store.batch():
                wired.jobs(name)
            return job_statuses(wired.store, [name])[name]["phase"]

        assert look("held") == "Waiting"
        assert reads == ["held"]  # the first look reads it
        assert look("held") == "Waiting"
        assert reads == []  # the controller's own write is the latest: nothing to read
        set_suspend(wired.store, "held", True)  # another writer commits
        assert look("held") == "Suspended"  # so the job is read, and the suspension seen
        assert reads == ["held"]
        assert look("held") == "Suspended"
        assert reads == []


def test_a_batch_rolled_back_keeps_nothing_it_wrote(store_url, tmp_path, reads):
    """A batch whose commit failed lost its writes: the jobs it wrote are read again."""
    manifests = docs(job_yaml("held", held_by(tmp_path / "never")))
    with wired_controller(store_url, tmp_path, manifests) as wired:
        with pytest.raises(RuntimeError), wired.store.batch():
            wired.jobs("held")  # writes it Waiting, accepted
            raise RuntimeError("the batch fails before its commit")
        wired.jobs.forget()  # what the runtime does after a lost batch
        reads.clear()
        with wired.store.batch():
            wired.jobs("held")
        assert reads == ["held"]
        assert job_statuses(wired.store, ["held"])["held"]["phase"] == "Waiting"


def test_the_jobs_read_to_order_a_batch_are_not_read_again_by_its_steps(store_url, tmp_path, reads):
    """The jobs of a batch never seen before are read in one statement to order them by
    priority (`JobReconciler.by_priority`), inside the batch: their steps take them from there."""
    held = held_by(tmp_path / "never")
    manifests = docs(job_yaml("low", held), job_yaml("high", f"{held}\npriority: 5"))
    with wired_controller(store_url, tmp_path, manifests) as wired:
        with wired.store.batch():
            order = wired.jobs.by_priority(["low", "high"])
            assert order == ["high", "low"]
            for name in order:
                wired.jobs(name)
        assert reads == []
        assert {n: s["phase"] for n, s in job_statuses(wired.store, order).items()} == {
            "high": "Waiting",
            "low": "Waiting",
        }


def test_each_worker_thread_keeps_its_own_jobs(store_url, tmp_path, reads):
    """An epoch is one thread's: with several workers, a job one kept is read by another, and
    one worker's new epoch does not drop what another kept."""
    import threading

    with wired_controller(store_url, tmp_path, docs(job_yaml("held", held_by(tmp_path / "never")))) as wired:

        def look() -> None:
            with wired.store.batch():
                wired.jobs("held")

        def elsewhere() -> list[str]:
            reads.clear()
            thread = threading.Thread(target=look)
            thread.start()
            thread.join(30)
            return list(reads)

        look()  # this thread keeps it
        assert elsewhere() == ["held"]  # another thread reads it: it kept nothing
        reads.clear()
        look()
        assert reads == []  # this thread's copy stands: the other's epoch did not clear it
