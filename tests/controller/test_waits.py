"""waits.py: until/delay/path/probe checks, the all/any gate, sticky satisfaction, recheck times."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.api.job import WaitCondition, WaitFor
from reconciler.api.meta import from_epoch
from reconciler.clock import FakeClock
from reconciler.controller.waits import PATH_POLL, Check, check, check_path, evaluate, gate

T0 = FakeClock().now()  # acceptance


def cond(**fields) -> WaitCondition:
    return WaitCondition.model_validate(fields)


def wait_for(*conditions: dict, mode: str = "all") -> WaitFor:
    return WaitFor.model_validate({"mode": mode, "conditions": list(conditions)})


class FakeProbe:
    """A probe runner that answers from a script and records what it was asked."""

    def __init__(self, *answers: tuple[bool, str] | None):
        self.answers = list(answers)
        self.calls: list[WaitCondition] = []

    def __call__(self, condition: WaitCondition) -> tuple[bool, str] | None:
        self.calls.append(condition)
        return self.answers.pop(0)


def no_probe(condition: WaitCondition) -> tuple[bool, str]:
    raise AssertionError("no probe may run for this condition")


# --- until and delay -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "now", "satisfied", "recheck"),
    [
        pytest.param(60, T0, False, 60.0, id="future"),
        pytest.param(60, T0 + 59.5, False, 0.5, id="almost"),
        pytest.param(60, T0 + 60, True, None, id="exactly-reached"),
        pytest.param(60, T0 + 3600, True, None, id="long-past"),
        pytest.param(-60, T0, True, None, id="before-acceptance"),
    ],
)
def test_until(offset, now, satisfied, recheck):
    condition = cond(until=from_epoch(T0 + offset))
    c = check(condition, accepted_at=T0, now=now, probe=no_probe)
    assert (c.type, c.satisfied, c.fatal) == ("until", satisfied, False)
    assert c.recheck_in == (None if recheck is None else pytest.approx(recheck))
    assert c.message == ("time reached" if satisfied else f"until {condition.until.isoformat()}")


@pytest.mark.parametrize(
    ("delay", "now", "satisfied", "recheck", "message"),
    [
        pytest.param("30s", T0, False, 30.0, f"delay of 30s until {from_epoch(T0 + 30)}", id="just-accepted"),
        pytest.param("30s", T0 + 10, False, 20.0, f"delay of 30s until {from_epoch(T0 + 30)}", id="part-elapsed"),
        pytest.param(
            "2h", T0 + 1.5, False, 7198.5, f"delay of 2h until {from_epoch(T0 + 7200)}", id="a-duration-not-seconds"
        ),
        pytest.param("30s", T0 + 30, True, None, "delay elapsed", id="exactly-elapsed"),
        pytest.param("500ms", T0 + 1, True, None, "delay elapsed", id="sub-second-elapsed"),
        pytest.param("0s", T0, True, None, "delay elapsed", id="zero-delay"),
    ],
)
def test_delay_counts_from_acceptance(delay, now, satisfied, recheck, message):
    c = check(cond(delay=delay), accepted_at=T0, now=now, probe=no_probe)
    assert (c.type, c.satisfied, c.message) == ("delay", satisfied, message)
    assert c.recheck_in == recheck


# --- path ------------------------------------------------------------------------------------


@pytest.fixture
def fs(tmp_path: Path) -> Path:
    (tmp_path / "ready.txt").write_text("ok")
    (tmp_path / "outdir").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("name", "kind", "satisfied", "message"),
    [
        pytest.param("ready.txt", None, True, "{p} exists", id="file-exists"),
        pytest.param("outdir", None, True, "{p} exists", id="dir-exists"),
        pytest.param("missing", None, False, "{p} does not exist", id="missing"),
        pytest.param("ready.txt", "file", True, "{p} is a file", id="file-as-file"),
        pytest.param("outdir", "file", False, "{p} is not a file", id="dir-as-file"),
        pytest.param("missing", "file", False, "{p} is not a file", id="missing-as-file"),
        pytest.param("outdir", "dir", True, "{p} is a directory", id="dir-as-dir"),
        pytest.param("ready.txt", "dir", False, "{p} is not a directory", id="file-as-dir"),
        pytest.param("missing", "dir", False, "{p} is not a directory", id="missing-as-dir"),
    ],
)
def test_path(fs, name, kind, satisfied, message):
    p = str(fs / name)
    fields = {"path": p} | ({"type": kind} if kind else {})
    c = check(cond(**fields), accepted_at=T0, now=T0, probe=no_probe)
    assert (c.type, c.satisfied, c.message, c.fatal) == ("path", satisfied, message.format(p=p), False)
    assert check_path(p, kind) == (satisfied, message.format(p=p))


@pytest.mark.parametrize(
    ("interval", "recheck"),
    [
        pytest.param(None, PATH_POLL, id="default-poll"),
        pytest.param("250ms", 0.25, id="own-interval"),
    ],
)
def test_path_recheck_interval(tmp_path, interval, recheck):
    fields = {"path": str(tmp_path / "later")} | ({"interval": interval} if interval else {})
    c = check(cond(**fields), accepted_at=T0, now=T0, probe=no_probe)
    assert (c.satisfied, c.recheck_in) == (False, recheck)


def test_path_appearing_later_is_seen(tmp_path):
    target = tmp_path / "flag"
    c = cond(path=str(target))
    assert not check(c, accepted_at=T0, now=T0, probe=no_probe).satisfied
    target.write_text("")
    later = check(c, accepted_at=T0, now=T0 + 1, probe=no_probe)
    assert later.satisfied and later.recheck_in is None


def test_path_check_can_be_injected():
    seen = []

    def fake(path, kind):
        seen.append((path, kind))
        return True, "fake says yes"

    c = check(cond(path="/nowhere", type="dir"), accepted_at=T0, now=T0, probe=no_probe, path_check=fake)
    assert (c.satisfied, c.message, seen) == (True, "fake says yes", [("/nowhere", "dir")])


# --- probe -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("probe", "answer", "satisfied", "fatal", "recheck"),
    [
        pytest.param({"command": ["pg_isready"]}, (True, "accepting"), True, False, None, id="ok"),
        pytest.param({"command": ["pg_isready"]}, (False, "exit 2"), False, False, 2.0, id="fails-default-interval"),
        pytest.param(
            {"command": ["x"], "interval": "5s"}, (False, "exit 1"), False, False, 5.0, id="fails-own-interval"
        ),
        pytest.param({"command": ["x"], "fatalOnError": True}, (False, "exit 1"), False, True, 2.0, id="fails-fatal"),
        pytest.param({"command": ["x"], "fatalOnError": True}, (True, "ok"), True, False, None, id="fatal-flag-but-ok"),
    ],
)
def test_probe(probe, answer, satisfied, fatal, recheck):
    runner = FakeProbe(answer)
    c = cond(probe=probe)
    result = check(c, accepted_at=T0, now=T0, probe=runner)
    assert result == Check("probe", satisfied, answer[1], fatal=fatal, recheck_in=recheck)
    assert runner.calls == [c]


def test_a_probe_without_a_verdict_yet_is_unsatisfied_and_needs_no_timer():
    """The probe runner wakes the job when the first probe ends."""
    wf = wait_for({"probe": {"command": ["x"], "fatalOnError": True}})
    [first] = evaluate(wf, accepted_at=T0, now=T0, probe=FakeProbe(None))
    assert first == Check("probe", False, "probe running", fatal=False, recheck_in=None)


# --- gate ------------------------------------------------------------------------------------


def _checks(*values: bool) -> list[Check]:
    return [Check("path", v, "") for v in values]


@pytest.mark.parametrize(
    ("wf", "values", "open_"),
    [
        pytest.param(None, (), True, id="no-waitFor"),
        pytest.param(WaitFor(), (), True, id="no-conditions"),
        pytest.param(WaitFor(mode="any"), (), True, id="any-with-no-conditions"),
        pytest.param(wait_for({"delay": "1s"}, {"delay": "2s"}), (True, True), True, id="all-every-one"),
        pytest.param(wait_for({"delay": "1s"}, {"delay": "2s"}), (True, False), False, id="all-one-missing"),
        pytest.param(wait_for({"delay": "1s"}, {"delay": "2s"}), (False, False), False, id="all-none"),
        pytest.param(wait_for({"delay": "1s"}, {"delay": "2s"}, mode="any"), (False, True), True, id="any-one"),
        pytest.param(wait_for({"delay": "1s"}, {"delay": "2s"}, mode="any"), (False, False), False, id="any-none"),
    ],
)
def test_gate(wf, values, open_):
    assert gate(wf, _checks(*values)) is open_


# --- evaluate --------------------------------------------------------------------------------


def test_evaluate_without_wait_for_is_empty():
    assert evaluate(None, accepted_at=T0, now=T0, probe=no_probe) == []


def test_evaluate_checks_every_condition_in_order(tmp_path):
    wf = wait_for({"delay": "10s"}, {"path": str(tmp_path)}, {"probe": {"command": ["x"]}})
    checks = evaluate(wf, accepted_at=T0, now=T0 + 4, probe=FakeProbe((False, "not yet")))
    assert [(c.type, c.satisfied, c.recheck_in) for c in checks] == [
        ("delay", False, 6.0),
        ("path", True, None),
        ("probe", False, 2.0),
    ]
    assert not gate(wf, checks)


def test_all_mode_keeps_a_satisfied_condition_satisfied(tmp_path):
    flag = tmp_path / "flag"
    flag.write_text("")
    wf = wait_for({"path": str(flag)}, {"delay": "1m"})
    first = evaluate(wf, accepted_at=T0, now=T0, probe=no_probe)
    assert [c.satisfied for c in first] == [True, False]
    flag.unlink()  # consumed once seen
    previous = [{"type": c.type, "satisfied": c.satisfied, "message": c.message} for c in first]
    second = evaluate(wf, accepted_at=T0, now=T0 + 60, probe=no_probe, previous=previous)
    assert [c.satisfied for c in second] == [True, True]
    assert second[0].message == f"{flag} exists"
    assert gate(wf, second)


def test_all_mode_does_not_rerun_a_probe_that_already_passed():
    wf = wait_for({"probe": {"command": ["x"]}}, {"delay": "1m"})
    previous = [
        {"type": "probe", "satisfied": True, "message": "ok"},
        {"type": "delay", "satisfied": False, "message": f"delay of 1m until {from_epoch(T0 + 60)}"},
    ]
    checks = evaluate(wf, accepted_at=T0, now=T0 + 1, probe=no_probe, previous=previous)
    assert checks[0] == Check("probe", True, "ok")


def test_any_mode_rechecks_every_condition(tmp_path):
    flag = tmp_path / "flag"
    wf = wait_for({"path": str(flag)}, {"delay": "1h"}, mode="any")
    previous = [
        {"type": "path", "satisfied": True, "message": f"{flag} exists"},
        {"type": "delay", "satisfied": False, "message": ""},
    ]
    checks = evaluate(wf, accepted_at=T0, now=T0 + 1, probe=no_probe, previous=previous)
    assert [c.satisfied for c in checks] == [False, False]
    assert not gate(wf, checks)


def test_previous_unsatisfied_is_checked_again(tmp_path):
    wf = wait_for({"path": str(tmp_path)})
    previous = [{"type": "path", "satisfied": False, "message": "old"}]
    [c] = evaluate(wf, accepted_at=T0, now=T0, probe=no_probe, previous=previous)
    assert c.satisfied and c.message == f"{tmp_path} exists"


def test_kept_condition_without_message_says_satisfied():
    wf = wait_for({"delay": "1h"})
    [c] = evaluate(wf, accepted_at=T0, now=T0, probe=no_probe, previous=[{"type": "delay", "satisfied": True}])
    assert c == Check("delay", True, "satisfied")


def test_recheck_in_values_across_condition_kinds(tmp_path):
    wf = wait_for(
        {"until": from_epoch(T0 + 90)},
        {"delay": "45s"},
        {"path": str(tmp_path / "x"), "interval": "3s"},
        {"probe": {"command": ["x"], "interval": "7s"}},
    )
    checks = evaluate(wf, accepted_at=T0, now=T0 + 15, probe=FakeProbe((False, "no")))
    assert [c.recheck_in for c in checks] == [75.0, 30.0, 3.0, 7.0]
    assert min(c.recheck_in for c in checks) == 3.0
