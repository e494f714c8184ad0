"""A job created with `suspend: true` is stored Suspended, as the controller's first look
would leave it (and said so in its events), so that look writes nothing; resumed, it runs."""

from __future__ import annotations

from reconciler.apply import apply_manifests
from reconciler.manifests import parse_text
from reconciler.reads import job_statuses
from reconciler.store import eventlog
from reconciler.store import repository as repo
from tests.helpers import wait_until
from tests.integration.wired import wired_controller

from .conftest import docs, job_yaml

SHOWN = ("phase", "reason", "message", "outcome")


def test_a_suspended_job_is_stored_as_the_first_look_would_leave_it(store_url, tmp_path):
    def manifests(reference_suspended: bool, paused_suspended: bool = True) -> str:
        return docs(
            job_yaml("paused", f"command: ['true']\nsuspend: {str(paused_suspended).lower()}"),
            job_yaml("paused-after", "command: ['true']\nsuspend: true\ndependsOn: [paused]"),
            job_yaml("reference", f"command: ['true']\nsuspend: {str(reference_suspended).lower()}"),
        )

    def stored(name: str):
        with wired.store.read() as session:
            obj = repo.get(session, kind="Job", name=name)
            said = [(e.reason, e.message) for e in eventlog.newest(session, kind="Job", name=name)]
        assert obj is not None
        return obj.resource_version, obj.status, said

    def apply(text: str) -> None:
        parsed, problems = parse_text(text, "again.yaml", tmp_path)
        assert not problems
        apply_manifests(wired.store, parsed)

    with wired_controller(store_url, tmp_path, manifests(reference_suspended=False)) as wired:
        # the reference: stored Waiting, suspended afterwards, and so moved by the controller
        apply(manifests(reference_suspended=True))
        wired.jobs("reference")
        _, reference, reference_said = stored("reference")
        assert reference["phase"] == "Suspended"

        for name in ("paused", "paused-after"):
            version, status, said = stored(name)
            assert {k: status.get(k) for k in SHOWN} == {k: reference.get(k) for k in SHOWN}, name
            assert said == [("Created", "job created by apply"), reference_said[-1]], name
            wired.jobs(name)
            assert stored(name) == (version, status, said), name  # the first look found what apply stored
        assert (stored("paused-after")[1]["dependencies"], stored("paused-after")[1]["waits"]) == ([], [])

        apply(manifests(reference_suspended=True, paused_suspended=False))  # resumed: it runs

        def completed() -> bool:  # its run must exit, which takes what it takes
            wired.jobs("paused")
            return job_statuses(wired.store, ["paused"])["paused"].get("outcome") == "Succeeded"

        wait_until(completed, message="paused resumed and succeeded")
        _, status, said = stored("paused")
        assert ("Resumed", "resumed") in said
