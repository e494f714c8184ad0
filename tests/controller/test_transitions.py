"""transitions.py: the one table of allowed phase changes, and what `move` stamps."""

from __future__ import annotations

import copy

import pytest

from reconciler.api.meta import from_epoch
from reconciler.api.status import LIVE_PHASES
from reconciler.clock import FakeClock
from reconciler.controller.transitions import ALLOWED, Event, IllegalTransition, move

PHASES = sorted(ALLOWED)
T1, T2, T3, T4 = (from_epoch(FakeClock().now() + i) for i in range(4))


def _outcome_for(to: str) -> str | None:
    return "Succeeded" if to == "Completed" else None


ALLOWED_PAIRS = [(src, dst) for src in PHASES for dst in sorted(ALLOWED[src])]
DISALLOWED_PAIRS = [(src, dst) for src in PHASES for dst in PHASES if dst != src and dst not in ALLOWED[src]]


def test_the_table_covers_every_phase():
    assert set(PHASES) == {"Waiting", "Queued", "Starting", "Running", "Backoff", "Stopping", "Suspended", "Completed"}
    assert all(dst in ALLOWED for dsts in ALLOWED.values() for dst in dsts)
    assert DISALLOWED_PAIRS, "some transitions must be refused"


@pytest.mark.parametrize(("src", "dst"), ALLOWED_PAIRS, ids=[f"{s}->{d}" for s, d in ALLOWED_PAIRS])
def test_every_allowed_transition_succeeds(src, dst):
    status = {"phase": src}
    event = move(status, dst, reason="Because", message="a sentence", now=T1, outcome=_outcome_for(dst))
    assert status["phase"] == dst
    assert (status["reason"], status["message"], status["outcome"]) == ("Because", "a sentence", _outcome_for(dst))
    assert isinstance(event, Event)


@pytest.mark.parametrize(("src", "dst"), DISALLOWED_PAIRS, ids=[f"{s}->{d}" for s, d in DISALLOWED_PAIRS])
def test_disallowed_transition_raises_and_changes_nothing(src, dst):
    status = {"phase": src, "reason": "Old", "message": "old", "outcome": None}
    before = copy.deepcopy(status)
    with pytest.raises(IllegalTransition, match=f"{src} -> {dst}"):
        move(status, dst, reason="Because", message="m", now=T1, outcome=_outcome_for(dst))
    assert status == before


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        pytest.param("Waiting", "Running", id="cannot-run-without-admission"),
        pytest.param("Queued", "Running", id="cannot-skip-starting"),
        pytest.param("Running", "Queued", id="running-must-stop-first"),
        pytest.param("Completed", "Queued", id="completed-only-to-waiting"),
        pytest.param("Backoff", "Running", id="backoff-must-requeue"),
    ],
)
def test_notable_disallowed_transitions(src, dst):
    assert (src, dst) in DISALLOWED_PAIRS


def test_missing_phase_counts_as_waiting():
    status: dict = {}
    move(status, "Queued", reason="Eligible", message="m", now=T1)
    assert status["phase"] == "Queued"
    with pytest.raises(IllegalTransition):
        move({}, "Running", reason="x", message="m", now=T1)


@pytest.mark.parametrize("phase", [p for p in PHASES if p != "Completed"])
def test_staying_in_a_phase_updates_reason_and_message(phase):
    status = {"phase": phase, "reason": "Old", "message": "old"}
    move(status, phase, reason="New", message="new", now=T1)
    assert (status["phase"], status["reason"], status["message"]) == (phase, "New", "new")


@pytest.mark.parametrize("src", sorted(p for p in PHASES if "Completed" in ALLOWED[p]))
def test_completed_requires_an_outcome(src):
    status = {"phase": src}
    with pytest.raises(IllegalTransition, match="outcome"):
        move(status, "Completed", reason="Done", message="m", now=T1)
    assert status == {"phase": src}


@pytest.mark.parametrize(
    ("src", "dst"), [("Waiting", "Queued"), ("Running", "Backoff"), ("Completed", "Waiting"), ("Queued", "Queued")]
)
def test_only_completed_takes_an_outcome(src, dst):
    with pytest.raises(IllegalTransition, match="outcome"):
        move({"phase": src}, dst, reason="x", message="m", now=T1, outcome="Failed")


def _cond(status: dict, type_: str) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


@pytest.mark.parametrize(
    ("outcome", "succeeded"),
    [
        ("Succeeded", "True"),
        ("Failed", "False"),
        ("TimedOut", "False"),
        ("Cancelled", "False"),
        ("Aborted", "False"),
        ("Lost", "False"),
    ],
)
def test_completing_sets_completed_and_succeeded_conditions(outcome, succeeded):
    status = {"phase": "Running", "nextRunAt": T1}
    move(status, "Completed", reason="SomeReason", message="done", now=T2, outcome=outcome)
    assert _cond(status, "Completed") == {
        "type": "Completed",
        "status": "True",
        "reason": outcome,
        "message": "done",
        "lastTransitionTime": T2,
    }
    assert _cond(status, "Succeeded") == {
        "type": "Succeeded",
        "status": succeeded,
        "reason": "SomeReason",
        "message": "done",
        "lastTransitionTime": T2,
    }
    assert status["completionTime"] == T2
    assert "nextRunAt" not in status


def test_last_transition_time_changes_only_when_status_flips():
    status = {
        "phase": "Waiting",
        "conditions": [
            {"type": "Succeeded", "status": "False", "reason": "Old", "message": "old", "lastTransitionTime": T1}
        ],
    }
    move(status, "Completed", reason="BackoffLimitExceeded", message="failed", now=T2, outcome="Failed")
    succeeded = _cond(status, "Succeeded")
    assert succeeded["status"] == "False"
    assert succeeded["lastTransitionTime"] == T1  # unchanged: still False
    assert (succeeded["reason"], succeeded["message"]) == ("BackoffLimitExceeded", "failed")  # refreshed
    move(status, "Waiting", reason="NewRevision", message="again", now=T3)
    move(status, "Completed", reason="Succeeded", message="ok", now=T4, outcome="Succeeded")
    assert _cond(status, "Succeeded")["status"] == "True"
    assert _cond(status, "Succeeded")["lastTransitionTime"] == T4  # flipped
    assert [c["type"] for c in status["conditions"]].count("Succeeded") == 1


def test_admitted_condition_follows_slot_holding_phases():
    status = {"phase": "Queued"}
    move(status, "Starting", reason="Admitted", message="run 1: 1 slot(s) granted", now=T1)
    assert _cond(status, "Admitted") == {
        "type": "Admitted",
        "status": "True",
        "reason": "SlotsGranted",
        "message": "run 1: 1 slot(s) granted",
        "lastTransitionTime": T1,
    }
    move(status, "Running", reason="Started", message="started", now=T2)
    assert _cond(status, "Admitted")["lastTransitionTime"] == T1  # still holding: untouched
    assert _cond(status, "Admitted")["message"] == "run 1: 1 slot(s) granted"
    move(status, "Backoff", reason="BackoffScheduled", message="retry", now=T3)
    assert _cond(status, "Admitted") == {
        "type": "Admitted",
        "status": "False",
        "reason": "SlotsReleased",
        "message": "",
        "lastTransitionTime": T3,
    }
    move(status, "Queued", reason="BackoffElapsed", message="queued", now=T4)
    assert _cond(status, "Admitted")["lastTransitionTime"] == T3  # still not holding: untouched


def test_readmission_refreshes_the_admitted_message_without_a_flip():
    status = {
        "phase": "Starting",
        "conditions": [
            {
                "type": "Admitted",
                "status": "True",
                "reason": "SlotsGranted",
                "message": "run 1",
                "lastTransitionTime": T1,
            }
        ],
    }
    move(status, "Starting", reason="Admitted", message="run 2", now=T2)
    assert _cond(status, "Admitted") == {
        "type": "Admitted",
        "status": "True",
        "reason": "SlotsGranted",
        "message": "run 2",
        "lastTransitionTime": T1,
    }


@pytest.mark.parametrize(
    ("src", "dst", "admitted"),
    [
        pytest.param("Queued", "Starting", "True", id="admission"),
        pytest.param("Starting", "Queued", "False", id="admission-lost"),
        pytest.param("Stopping", "Suspended", "False", id="suspended-releases"),
        pytest.param("Running", "Completed", "False", id="completion-releases"),
        pytest.param("Waiting", "Queued", None, id="no-slots-involved"),
    ],
)
def test_admitted_condition_on_entering_or_leaving_holding_phases(src, dst, admitted):
    status = {"phase": src}
    move(status, dst, reason="R", message="m", now=T1, outcome=_outcome_for(dst))
    cond = _cond(status, "Admitted")
    assert (cond and cond["status"]) == admitted
    assert (dst in LIVE_PHASES) == (admitted == "True")


@pytest.mark.parametrize(
    ("outcome", "warning"),
    [
        ("Succeeded", False),
        ("Cancelled", False),
        ("Failed", True),
        ("TimedOut", True),
        ("Aborted", True),
        ("Lost", True),
    ],
)
def test_completion_event_reason_and_warning(outcome, warning):
    event = move({"phase": "Running"}, "Completed", reason="Why", message="msg", now=T1, outcome=outcome)
    assert event == Event(outcome, "msg", warning)


@pytest.mark.parametrize(
    ("to", "event_reason", "expected_reason"),
    [
        pytest.param("Queued", None, "Eligible", id="reason-by-default"),
        pytest.param("Queued", "Requeued", "Requeued", id="explicit-event-reason"),
    ],
)
def test_non_completion_event(to, event_reason, expected_reason):
    event = move({"phase": "Waiting"}, to, reason="Eligible", message="m", now=T1, event_reason=event_reason)
    assert event == Event(expected_reason, "m", False)


def test_explicit_event_reason_overrides_outcome_and_keeps_warning():
    event = move(
        {"phase": "Running"}, "Completed", reason="R", message="m", now=T1, outcome="Lost", event_reason="RunLost"
    )
    assert event == Event("RunLost", "m", True)


def _at(seconds: float) -> str:
    return from_epoch(1_800_000_000 + seconds)


@pytest.mark.parametrize(
    ("before", "back_to"),
    [("Waiting", "Waiting"), ("Queued", "Queued"), ("Backoff", "Backoff"), ("Stopping", "Waiting")],
)
def test_time_suspended_is_kept_from_every_way_in_and_out(before, back_to):
    """The move into Suspended stamps suspendedAt; the move out adds the time to
    suspendedSeconds (the job timeout leaves it out); two suspensions add up."""
    status = {"phase": before, "revision": 1}
    move(status, "Suspended", reason="Suspended", message="", now=_at(10))
    assert status["suspendedAt"] == _at(10)
    move(status, back_to, reason="Resumed", message="", now=_at(12.5))
    assert "suspendedAt" not in status and status["suspendedSeconds"] == 2.5
    move(status, "Suspended", reason="Suspended", message="", now=_at(20))
    move(status, "Completed", reason="Cancelled", message="", now=_at(21), outcome="Cancelled")
    assert "suspendedAt" not in status and status["suspendedSeconds"] == 3.5


def test_a_move_that_stays_suspended_keeps_when_it_began():
    status = {"phase": "Waiting", "revision": 1}
    move(status, "Suspended", reason="Suspended", message="", now=_at(1))
    move(status, "Suspended", reason="Suspended", message="again", now=_at(5))
    assert status["suspendedAt"] == _at(1)


def test_a_new_revision_starts_its_clock_anew_even_while_suspended():
    from reconciler.api.status import next_revision

    status = {"phase": "Suspended", "revision": 1, "suspendedAt": _at(1), "suspendedSeconds": 7.0}
    next_revision(status, _at(50))
    assert status["suspendedAt"] == _at(50) and "suspendedSeconds" not in status
