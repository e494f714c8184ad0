"""api/status.py: the controller's typed view of a job's status (TypedDicts over the stored
JSON) and the schema's view (pydantic models, from which the CRDs come) name the same fields."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from reconciler.api import status as s
from reconciler.api.meta import Condition

PAIRS = [
    (s.JobStatus, s.JobStatusDict),
    (s.RunRecord, s.RunDict),
    (s.Receipt, s.ReceiptDict),
    (s.WaitResult, s.WaitDict),
    (s.Admission, s.AdmissionDict),
    (s.QueuePlace, s.QueuePlaceDict),
    (s.FullScope, s.FullScopeDict),
    (s.StopRequest, s.StopDict),
    (Condition, s.ConditionDict),
]


@pytest.mark.parametrize(("model", "typed"), PAIRS, ids=[m.__name__ for m, _ in PAIRS])
def test_the_typed_view_and_the_schema_name_the_same_fields(model: type[BaseModel], typed: type) -> None:
    schema_fields = {f.alias or name for name, f in model.model_fields.items()}
    assert set(typing.get_type_hints(typed)) == schema_fields


def test_phases_and_outcomes_are_the_strings_of_the_contract() -> None:
    assert [p.value for p in s.Phase] == [
        "Waiting", "Queued", "Starting", "Running", "Backoff", "Stopping", "Suspended", "Completed",
    ]  # fmt: skip
    assert {o.value for o in s.Outcome} == {"Succeeded", "Failed", "TimedOut", "Cancelled", "Aborted", "Lost"}
    assert s.Phase.COMPLETED == "Completed"  # a stored string compares equal to its member


def test_next_revision_clears_the_revision_and_keeps_the_runs() -> None:
    status: s.JobStatusDict = {
        "phase": "Completed",
        "revision": 2,
        "acceptedAt": "2026-01-01T00:00:00.000Z",
        "eligibleAt": "2026-01-01T00:00:01.000Z",
        "nodeName": "n1",
        "runs": [{"number": 1, "revision": 2}],
        "dependencies": [{"job": "a", "revision": 1, "satisfied": True}],
        "bypassCount": 2,
        "conditions": [
            {"type": "Completed", "status": "True"},
            {"type": "Succeeded", "status": "True"},
            {"type": "Admitted", "status": "False"},
        ],
    }
    s.next_revision(status, "2026-01-02T00:00:00.000Z")
    assert status["revision"] == 3
    assert status["acceptedAt"] == "2026-01-02T00:00:00.000Z"
    assert "eligibleAt" not in status and "nodeName" not in status
    assert status["runs"] == [{"number": 1, "revision": 2}]
    assert status["dependencies"] == [] and status["waits"] == [] and status["bypassCount"] == 0
    assert [c["type"] for c in status["conditions"]] == ["Admitted"]


def test_a_dependency_asks_for_an_outcome_or_finished() -> None:
    assert set(typing.get_args(s.DependencyOutcome)) == {o.value for o in s.Outcome} | {"Finished"}
