"""dependencies.py: receipts recorded once; pending, satisfied, or never satisfiable."""

from __future__ import annotations

import pytest

from reconciler.api.job import Dependency
from reconciler.api.meta import from_epoch
from reconciler.api.revisions import DepState
from reconciler.clock import FakeClock
from reconciler.controller.dependencies import describe_broken, evaluate

NOW = from_epoch(FakeClock().now())
EARLIER = from_epoch(FakeClock().now() - 600)


def dep(job: str, *outcomes: str) -> Dependency:
    return Dependency.model_validate({"job": job, "outcomes": list(outcomes)} if outcomes else job)


def done(outcome: str, *, uid: str = "uid-x", revision: int = 1) -> DepState:
    return DepState(uid, revision, "Completed", outcome)


def receipt(
    job: str, outcome: str | None, satisfied: bool, *, uid: str = "uid-x", revision: int = 1, at: str = NOW
) -> dict:
    if outcome is None:
        return {"job": job, "satisfied": satisfied, "observedAt": at, "outcome": None}
    return {"job": job, "uid": uid, "revision": revision, "outcome": outcome, "satisfied": satisfied, "observedAt": at}


@pytest.mark.parametrize("phase", ["Waiting", "Queued", "Starting", "Running", "Backoff", "Stopping", "Suspended"])
def test_pending_while_the_dependency_is_not_completed(phase):
    v = evaluate([dep("prep")], {"prep": DepState("uid-x", 1, phase, None)}, [], NOW)
    assert (v.satisfied, v.broken, v.pending, v.receipts) == (False, None, ["prep"], [])


def test_completed_without_an_outcome_yet_is_still_pending():
    v = evaluate([dep("prep")], {"prep": DepState("uid-x", 1, "Completed", None)}, [], NOW)
    assert v.pending == ["prep"] and not v.satisfied


@pytest.mark.parametrize(
    ("outcomes", "outcome", "satisfied"),
    [
        pytest.param((), "Succeeded", True, id="shorthand-means-Succeeded"),
        pytest.param((), "Failed", False, id="shorthand-Failed-breaks"),
        pytest.param(("Succeeded", "Failed"), "Failed", True, id="listed-Failed"),
        pytest.param(("Succeeded", "Failed"), "TimedOut", False, id="unlisted-TimedOut"),
        pytest.param(("Finished",), "Succeeded", True, id="Finished-Succeeded"),
        pytest.param(("Finished",), "Failed", True, id="Finished-Failed"),
        pytest.param(("Finished",), "Cancelled", True, id="Finished-Cancelled"),
        pytest.param(("Finished",), "Aborted", True, id="Finished-Aborted"),
        pytest.param(("Finished",), "Lost", True, id="Finished-Lost"),
        pytest.param(("Failed",), "Succeeded", False, id="only-Failed-and-it-succeeded"),
        pytest.param(("Aborted", "Lost"), "Lost", True, id="listed-Lost"),
    ],
)
def test_a_completed_dependency_writes_a_receipt(outcomes, outcome, satisfied):
    v = evaluate([dep("prep", *outcomes)], {"prep": done(outcome, uid="uid-p", revision=3)}, [], NOW)
    expected = receipt("prep", outcome, satisfied, uid="uid-p", revision=3)
    assert v.receipts == [expected]
    assert v.pending == []
    assert v.satisfied is satisfied
    assert v.broken == (None if satisfied else expected)


@pytest.mark.parametrize(
    ("old", "now_state"),
    [
        pytest.param(
            receipt("prep", "Succeeded", True, at=EARLIER), done("Failed", revision=2), id="kept-after-rerun-failed"
        ),
        pytest.param(
            receipt("prep", "Succeeded", True, at=EARLIER),
            DepState("uid-x", 2, "Running", None),
            id="kept-while-dependency-runs-again",
        ),
        pytest.param(receipt("prep", "Succeeded", True, at=EARLIER), None, id="kept-after-dependency-deleted"),
        pytest.param(
            receipt("prep", "Failed", False, at=EARLIER),
            done("Succeeded", revision=2),
            id="broken-receipt-stays-broken",
        ),
    ],
)
def test_an_existing_receipt_is_never_rewritten(old, now_state):
    v = evaluate([dep("prep")], {"prep": now_state}, [old], NOW)
    assert v.receipts == [old]
    assert v.receipts[0]["observedAt"] == EARLIER
    assert v.satisfied is old["satisfied"]
    assert v.pending == []


@pytest.mark.parametrize(
    "observed",
    [
        pytest.param({"prep": None}, id="observed-as-none"),
        pytest.param({}, id="absent-from-observed"),
    ],
)
def test_a_missing_dependency_is_broken(observed):
    v = evaluate([dep("prep")], observed, [], NOW)
    assert not v.satisfied
    assert v.broken is not None and v.broken["outcome"] is None
    assert v.receipts == [receipt("prep", None, False)]
    assert describe_broken(v.broken, [dep("prep")]) == "dependency prep no longer exists"


def test_several_dependencies_all_satisfied():
    deps = [dep("a"), dep("b", "Finished"), dep("c", "Succeeded", "Failed")]
    observed = {"a": done("Succeeded", uid="ua"), "b": done("Lost", uid="ub"), "c": done("Failed", uid="uc")}
    v = evaluate(deps, observed, [], NOW)
    assert v.satisfied and v.broken is None and v.pending == []
    assert [r["job"] for r in v.receipts] == ["a", "b", "c"]


def test_one_pending_among_satisfied_keeps_the_job_waiting():
    deps = [dep("a"), dep("b")]
    v = evaluate(deps, {"a": done("Succeeded"), "b": DepState("ub", 1, "Running", None)}, [], NOW)
    assert not v.satisfied and v.broken is None
    assert v.pending == ["b"]
    assert [r["job"] for r in v.receipts] == ["a"]  # a's receipt is written now, once


def test_broken_is_reported_even_while_another_is_pending():
    deps = [dep("a"), dep("b")]
    v = evaluate(deps, {"a": DepState("ua", 1, "Running", None), "b": done("Failed", uid="ub")}, [], NOW)
    assert not v.satisfied
    assert v.pending == ["a"]
    assert v.broken == receipt("b", "Failed", False, uid="ub")


def test_the_first_broken_edge_is_the_one_reported():
    deps = [dep("a"), dep("b")]
    v = evaluate(deps, {"a": done("Cancelled", uid="ua"), "b": done("Failed", uid="ub")}, [], NOW)
    assert v.broken["job"] == "a"
    assert len(v.receipts) == 2


def test_new_receipts_join_existing_ones():
    deps = [dep("a"), dep("b")]
    old = receipt("a", "Succeeded", True, uid="ua", at=EARLIER)
    v = evaluate(deps, {"a": done("Failed", uid="ua", revision=9), "b": done("Succeeded", uid="ub")}, [old], NOW)
    assert v.receipts == [old, receipt("b", "Succeeded", True, uid="ub")]
    assert v.satisfied


def test_receipts_of_edges_no_longer_in_the_spec_are_dropped():
    old = [receipt("gone", "Succeeded", True), receipt("a", "Succeeded", True)]
    v = evaluate([dep("a")], {}, old, NOW)
    assert [r["job"] for r in v.receipts] == ["a"]


def test_no_dependencies_is_satisfied():
    assert evaluate([], {}, [], NOW).satisfied


@pytest.mark.parametrize(
    ("deps", "broken", "message"),
    [
        pytest.param(
            [dep("prep")],
            receipt("prep", "Failed", False, revision=2),
            "dependency prep ended Failed at revision 2, which can never satisfy Succeeded",
            id="default",
        ),
        pytest.param(
            [dep("lint", "Succeeded", "TimedOut")],
            receipt("lint", "Cancelled", False),
            "dependency lint ended Cancelled at revision 1, which can never satisfy Succeeded/TimedOut",
            id="several-outcomes",
        ),
        pytest.param(
            [dep("prep")],
            {**receipt("prep", None, False), "message": "the job no longer exists"},
            "dependency prep no longer exists",
            id="missing",
        ),
    ],
)
def test_describe_broken(deps, broken, message):
    assert describe_broken(broken, deps) == message
