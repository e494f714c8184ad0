"""A queued job's status is not rewritten while it only waits its turn (controller/queued.py,
_both_in_line): behind an older job that fits first, or short of slots, are one condition to
its user, and each freed slot used to flip the one to the other and back, two status writes
of every job queued behind a busy pool. A wired controller, never started, is driven by hand."""

from __future__ import annotations

from reconciler.reads import job_statuses
from reconciler.store import Store
from reconciler.store import repository as repo
from tests.helpers import wait_until
from tests.integration.wired import drive, pool_of_one, wired_controller


def _stored(store: Store, name: str) -> repo.StoredObject:
    with store.read() as session:
        found = repo.get(session, kind="Job", name=name)
    assert found is not None
    return found


def test_a_job_waiting_its_turn_is_not_rewritten_when_a_slot_frees_for_an_older_one(sqlite_url, tmp_path):
    with wired_controller(sqlite_url, tmp_path, pool_of_one("first", "older:1", "younger")) as wired:
        store = wired.store
        drive(wired, "first", "Starting")  # admitted and spawned: it holds the pool's slot
        drive(wired, "older", "Queued")  # the head of the line, by its priority
        drive(wired, "younger", "Queued")
        before = _stored(store, "younger")
        assert before.status is not None and before.status["reason"] == "InsufficientSlots"

        def first_completed() -> bool:
            wired.jobs("first")  # once /bin/true has exited: records it and frees the slot
            return job_statuses(store, ["first"])["first"].get("phase") == "Completed"

        wait_until(first_completed, message="the exit of `first` was not recorded")
        wired.jobs("younger")  # looked at before the head takes the slot: the head fits first
        assert _stored(store, "younger").resource_version == before.resource_version

        wired.jobs("older")  # the head takes the slot
        assert job_statuses(store, ["older"])["older"]["phase"] != "Queued"
        wired.jobs("younger")  # short of slots again, as its status said all along
        after = _stored(store, "younger")
        assert after.resource_version == before.resource_version
        assert after.status is not None and (after.status["phase"], after.status["reason"]) == (
            "Queued",
            "InsufficientSlots",
        )


def test_in_a_batch_the_head_of_the_line_is_admitted_and_the_younger_waits(store_url, tmp_path):
    """The loop's admissions in its batches (on PostgreSQL pipelined: the pools' facts, the
    lines and the nodes asked together): the freed slot goes to the head of the line, by
    priority, whichever of the two is looked at first."""
    with wired_controller(store_url, tmp_path, pool_of_one("first", "older:1", "younger")) as wired:
        store = wired.store

        def in_a_batch(*names: str) -> None:
            with store.batch():
                for name in names:
                    wired.jobs(name)

        def phase(name: str) -> str:
            return str(job_statuses(store, [name])[name].get("phase"))

        in_a_batch("first")  # admitted and spawned: it holds the pool's only slot
        assert phase("first") in ("Starting", "Running", "Completed")
        in_a_batch("younger", "older")  # both eligible now, and queued behind it
        assert (phase("younger"), phase("older")) == ("Queued", "Queued")

        def first_completed() -> bool:
            in_a_batch("first")
            return phase("first") == "Completed"

        wait_until(first_completed, message="the exit of `first` was not recorded")
        in_a_batch("younger", "older")
        assert phase("older") in ("Starting", "Running", "Completed")
        younger = job_statuses(store, ["younger"])["younger"]
        assert (younger["phase"], younger["reason"]) in (("Queued", "WaitingForTurn"), ("Queued", "InsufficientSlots"))
