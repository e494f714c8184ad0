"""retry.py: backoff delays and the after-run decision, in the order API.md section 2 fixes:
cancellation or job timeout; success; non-retryable outcome; retry limit; otherwise Backoff."""

from __future__ import annotations

import random

import pytest

from reconciler.api.job import Backoff, Restart, Retry
from reconciler.controller.retry import AfterRun, RunEnd, after_run, backoff_delay, restart_delay

from .conftest import fixed, no_rand

MID = 0.5  # a random draw of 0.5 adds no jitter


def backoff(**fields) -> Backoff:
    return Backoff.model_validate(fields)


def retry(**fields) -> Retry:
    return Retry.model_validate(fields)


# --- backoff_delay -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "retry_number", "expected"),
    [
        pytest.param({"policy": "constant", "delay": "2s"}, 1, 2.0, id="constant-first"),
        pytest.param({"policy": "constant", "delay": "2s"}, 5, 2.0, id="constant-fifth"),
        pytest.param({"policy": "linear", "delay": "2s"}, 1, 2.0, id="linear-first"),
        pytest.param({"policy": "linear", "delay": "2s"}, 3, 6.0, id="linear-third"),
        pytest.param({"policy": "exponential", "delay": "1s"}, 1, 1.0, id="exponential-first-is-base"),
        pytest.param({"policy": "exponential", "delay": "1s"}, 2, 2.0, id="exponential-default-factor-2"),
        pytest.param({"policy": "exponential", "delay": "1s"}, 4, 8.0, id="exponential-fourth"),
        pytest.param({"policy": "exponential", "delay": "500ms", "factor": 3}, 3, 4.5, id="exponential-factor-3"),
        pytest.param(
            {"policy": "exponential", "delay": "1s", "factor": 1}, 6, 1.0, id="exponential-factor-1-is-constant"
        ),
        pytest.param(
            {"policy": "exponential", "delay": "1s", "factor": 1.5}, 3, 2.25, id="exponential-fractional-factor"
        ),
        pytest.param({"policy": "constant", "delay": "0s"}, 3, 0.0, id="zero-delay"),
        pytest.param({"policy": "linear", "delay": "2s"}, 0, 2.0, id="retry-number-below-1-counts-as-first"),
    ],
)
def test_backoff_delay_by_policy(spec, retry_number, expected):
    assert backoff_delay(backoff(**spec), retry_number, fixed(MID)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("spec", "retry_number", "expected"),
    [
        pytest.param({"policy": "exponential", "delay": "1s", "maxDelay": "10s"}, 4, 8.0, id="exponential-below-cap"),
        pytest.param({"policy": "exponential", "delay": "1s", "maxDelay": "10s"}, 5, 10.0, id="exponential-capped"),
        pytest.param(
            {"policy": "exponential", "delay": "1s", "maxDelay": "10s"}, 60, 10.0, id="exponential-far-past-cap"
        ),
        pytest.param({"policy": "linear", "delay": "3s", "maxDelay": "7s"}, 3, 7.0, id="linear-capped"),
        pytest.param({"policy": "constant", "delay": "30s", "maxDelay": "5s"}, 1, 5.0, id="constant-above-cap"),
        pytest.param({"policy": "exponential", "delay": "1s", "maxDelay": "1s"}, 2, 1.0, id="cap-equal-to-base"),
    ],
)
def test_backoff_delay_is_capped_by_max_delay(spec, retry_number, expected):
    assert backoff_delay(backoff(**spec), retry_number, fixed(MID)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        pytest.param(0.0, 10.0 - 1.0, id="rand-0-gives-minus-half-jitter"),
        pytest.param(0.25, 10.0 - 0.5, id="rand-quarter"),
        pytest.param(0.5, 10.0, id="rand-half-gives-no-jitter"),
        pytest.param(1.0, 10.0 + 1.0, id="rand-1-gives-plus-half-jitter"),
    ],
)
def test_jitter_is_symmetric_full_width(draw, expected):
    spec = backoff(policy="constant", delay="10s", jitter="2s")
    assert backoff_delay(spec, 1, fixed(draw)) == pytest.approx(expected)


def test_jitter_applies_after_the_cap():
    # capped(delay) +- jitter/2: the cap bounds the base, jitter may then exceed it
    spec = backoff(policy="exponential", delay="1s", maxDelay="4s", jitter="2s")
    assert backoff_delay(spec, 10, fixed(1.0)) == pytest.approx(5.0)
    assert backoff_delay(spec, 10, fixed(0.0)) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        pytest.param(0.0, 0.0, id="rand-0-clamped-to-zero"),
        pytest.param(0.2, 0.0, id="rand-0.2-clamped-to-zero"),
        pytest.param(0.3, 0.1, id="rand-0.3-just-above-zero"),
        pytest.param(1.0, 1.5, id="rand-1-positive"),
    ],
)
def test_jitter_never_makes_the_delay_negative(draw, expected):
    spec = backoff(policy="constant", delay="500ms", jitter="2s")
    assert backoff_delay(spec, 1, fixed(draw)) == pytest.approx(expected)


def test_jitter_stays_within_bounds_for_many_draws():
    spec = backoff(policy="exponential", delay="1s", factor=2, maxDelay="1m", jitter="200ms")
    rng = random.Random(1234)
    for n in range(1, 12):
        base = min(2.0 ** (n - 1), 60.0)
        for _ in range(50):
            d = backoff_delay(spec, n, rng.random)
            assert base - 0.1 <= d <= base + 0.1


def test_without_jitter_the_random_draw_does_not_matter():
    spec = backoff(policy="linear", delay="1s")
    assert {backoff_delay(spec, 3, fixed(x)) for x in (0.0, 0.5, 1.0)} == {3.0}


@pytest.mark.parametrize("factor", [3, 10])
def test_exponential_delay_stays_capped_for_any_valid_retry_number(factor):
    """limit may be up to 1000, so retry numbers up to 1000 are valid; `factor ** (n - 1)`
    exceeds a float long before that for factor >= ~2.04, and the result must still be
    maxDelay rather than an OverflowError."""
    spec = backoff(policy="exponential", delay="1s", factor=factor, maxDelay="1m")
    assert backoff_delay(spec, 1000, fixed(MID)) == 60.0


def test_after_run_at_high_attempt_with_large_factor_schedules_capped_backoff():
    """The same through after_run: a valid spec (limit 1000, factor 10) must keep backing off
    maxDelay after ~310 failed runs instead of crashing the post-run decision."""
    r = retry(limit=1000, backoff={"policy": "exponential", "delay": "1s", "factor": 10, "maxDelay": "1m"})
    d = after_run(r, RunEnd("Failed", 1), attempts=400, cancelled=False, deadline_passed=False, rand=fixed(MID))
    assert d == AfterRun(True, delay=60.0, message=d.message)


# --- after_run: the decision order -----------------------------------------------------------

RETRY_ALL = {
    "limit": 3,
    "onExitCodes": [],
    "onTimeout": True,
    "onLost": True,
    "backoff": {"policy": "constant", "delay": "5s"},
}


@pytest.mark.parametrize(
    ("spec", "run", "attempts", "cancelled", "deadline", "outcome", "reason"),
    [
        # 1. cancellation or job timeout comes before everything else
        pytest.param(
            RETRY_ALL,
            RunEnd("Failed", 1),
            1,
            True,
            False,
            "Cancelled",
            "Cancelled",
            id="cancelled-beats-retryable-failure",
        ),
        pytest.param(
            RETRY_ALL, RunEnd("Succeeded", 0), 1, True, False, "Cancelled", "Cancelled", id="cancelled-beats-success"
        ),
        pytest.param(
            RETRY_ALL,
            RunEnd("Failed", 1),
            1,
            False,
            True,
            "TimedOut",
            "DeadlineExceeded",
            id="job-deadline-beats-retryable-failure",
        ),
        pytest.param(
            RETRY_ALL,
            RunEnd("Succeeded", 0),
            1,
            False,
            True,
            "TimedOut",
            "DeadlineExceeded",
            id="job-deadline-beats-success",
        ),
        pytest.param(
            {"limit": 0},
            RunEnd("Failed", 1),
            1,
            False,
            True,
            "TimedOut",
            "DeadlineExceeded",
            id="job-deadline-beats-retry-limit",
        ),
        pytest.param(
            RETRY_ALL,
            RunEnd("Failed", 1),
            1,
            True,
            True,
            "Cancelled",
            "Cancelled",
            id="cancelled-and-deadline-cancelled-wins",
        ),
        # 2. success
        pytest.param(RETRY_ALL, RunEnd("Succeeded", 0), 1, False, False, "Succeeded", None, id="success"),
        pytest.param(
            {"limit": 0},
            RunEnd("Succeeded", 0),
            1,
            False,
            False,
            "Succeeded",
            None,
            id="success-on-last-attempt-is-not-limit",
        ),
        pytest.param(
            {"limit": 2, "onExitCodes": [3]},
            RunEnd("Succeeded", 0),
            3,
            False,
            False,
            "Succeeded",
            None,
            id="success-after-retries",
        ),
        # 3. non-retryable outcomes
        pytest.param(
            {"limit": 3, "onExitCodes": [1, 75]},
            RunEnd("Failed", 2),
            1,
            False,
            False,
            "Failed",
            "NonRetryableExitCode",
            id="exit-code-not-listed",
        ),
        pytest.param(
            {"limit": 3, "onExitCodes": [1, 75]},
            RunEnd("Failed", None),
            1,
            False,
            False,
            "Failed",
            "NonRetryableExitCode",
            id="no-exit-code-with-a-code-list",
        ),
        pytest.param(
            {"limit": 0, "onExitCodes": [1]},
            RunEnd("Failed", 2),
            1,
            False,
            False,
            "Failed",
            "NonRetryableExitCode",
            id="non-retryable-beats-retry-limit",
        ),
        pytest.param(
            {"limit": 3, "onTimeout": False},
            RunEnd("TimedOut", -1),
            1,
            False,
            False,
            "TimedOut",
            "RunTimeout",
            id="run-timeout-without-onTimeout",
        ),
        pytest.param(
            {"limit": 3, "onLost": False}, RunEnd("Lost"), 1, False, False, "Lost", "NodeLost", id="lost-without-onLost"
        ),
        pytest.param(
            {"limit": 3, "onLost": False},
            RunEnd("Lost", reason="ProcessLost"),
            1,
            False,
            False,
            "Lost",
            "ProcessLost",
            id="lost-process-keeps-the-runs-reason",
        ),
        pytest.param(
            RETRY_ALL, RunEnd("StartFailed"), 1, False, False, "Failed", "StartFailed", id="start-failed-never-retried"
        ),
        pytest.param(
            RETRY_ALL,
            RunEnd("StartFailed", reason="ArtifactInvalid"),
            1,
            False,
            False,
            "Failed",
            "ArtifactInvalid",
            id="artifact-invalid-never-retried",
        ),
        pytest.param(
            {"limit": 2, "onExitCodes": [1]},
            RunEnd("StartFailed", reason="ArtifactInvalid", retryable=True),
            3,
            False,
            False,
            "Failed",
            "BackoffLimitExceeded",
            id="artifact-unreachable-past-the-limit-retries-used-up",
        ),
        pytest.param(
            RETRY_ALL, RunEnd("Cancelled"), 1, False, False, "Cancelled", "Cancelled", id="run-cancelled-not-retried"
        ),
        # 4. retry limit reached: attempts = limit + 1
        pytest.param(
            {"limit": 0},
            RunEnd("Failed", 1),
            1,
            False,
            False,
            "Failed",
            "BackoffLimitExceeded",
            id="limit-0-first-failure",
        ),
        pytest.param(
            {"limit": 2},
            RunEnd("Failed", 1),
            3,
            False,
            False,
            "Failed",
            "BackoffLimitExceeded",
            id="limit-2-third-failure",
        ),
        pytest.param(
            {"limit": 2, "onExitCodes": [75]},
            RunEnd("Failed", 75),
            3,
            False,
            False,
            "Failed",
            "BackoffLimitExceeded",
            id="listed-code-at-limit",
        ),
        pytest.param(
            {"limit": 1, "onTimeout": True},
            RunEnd("TimedOut", -1),
            2,
            False,
            False,
            "TimedOut",
            "BackoffLimitExceeded",
            id="retryable-timeout-at-limit-retries-used-up",
        ),
        pytest.param(
            {"limit": 0, "onTimeout": True},
            RunEnd("TimedOut", -1, reason="RunTimeout"),
            1,
            False,
            False,
            "TimedOut",
            "RunTimeout",
            id="retryable-timeout-none-allowed-keeps-RunTimeout",
        ),
        pytest.param(
            {"limit": 1, "onLost": True},
            RunEnd("Lost"),
            2,
            False,
            False,
            "Lost",
            "BackoffLimitExceeded",
            id="retryable-lost-at-limit-retries-used-up",
        ),
    ],
)
def test_after_run_ends_the_job(spec, run, attempts, cancelled, deadline, outcome, reason):
    d = after_run(retry(**spec), run, attempts=attempts, cancelled=cancelled, deadline_passed=deadline, rand=no_rand)
    assert (d.retry, d.outcome, d.reason) == (False, outcome, reason)
    assert d.delay == 0.0
    assert d.message


@pytest.mark.parametrize(
    ("spec", "run", "attempts", "delay"),
    [
        pytest.param({"limit": 1}, RunEnd("Failed", 1), 1, 1.0, id="default-backoff-first-retry"),
        pytest.param(
            {"limit": 3, "onExitCodes": []}, RunEnd("Failed", 137), 1, 1.0, id="empty-code-list-retries-any-nonzero"
        ),
        pytest.param({"limit": 3, "onExitCodes": [1, 75]}, RunEnd("Failed", 75), 1, 1.0, id="listed-exit-code"),
        pytest.param({"limit": 3, "onTimeout": True}, RunEnd("TimedOut", -1), 1, 1.0, id="timeout-with-onTimeout"),
        pytest.param({"limit": 3}, RunEnd("Lost"), 1, 1.0, id="lost-retried-by-default"),
        pytest.param(
            {"limit": 3, "backoff": {"delay": "1s", "factor": 2}},
            RunEnd("Failed", 1),
            3,
            4.0,
            id="third-attempt-uses-third-retry-delay",
        ),
        pytest.param(
            {"limit": 3, "backoff": {"policy": "linear", "delay": "2s"}},
            RunEnd("Failed", 1),
            2,
            4.0,
            id="linear-second-retry",
        ),
        pytest.param(
            {"limit": 5, "backoff": {"delay": "1s", "maxDelay": "3s"}}, RunEnd("Failed", 1), 5, 3.0, id="capped-delay"
        ),
        pytest.param({"limit": 2}, RunEnd("Failed", 1), 2, 2.0, id="last-retry-before-limit"),
        # an artifact's unreachable URL: a failed attempt whatever onExitCodes says (no exit code)
        pytest.param(
            {"limit": 2, "onExitCodes": [1]},
            RunEnd("StartFailed", reason="ArtifactInvalid", retryable=True),
            2,
            2.0,
            id="artifact-unreachable-retried",
        ),
    ],
)
def test_after_run_retries_with_computed_delay(spec, run, attempts, delay):
    d = after_run(retry(**spec), run, attempts=attempts, cancelled=False, deadline_passed=False, rand=fixed(MID))
    assert d.retry is True
    assert (d.outcome, d.reason) == (None, None)
    assert d.delay == pytest.approx(delay)


@pytest.mark.parametrize(
    ("draw", "delay"),
    [
        pytest.param(0.0, 3.5, id="rand-0"),
        pytest.param(1.0, 4.5, id="rand-1"),
    ],
)
def test_after_run_passes_the_random_source_to_the_jitter(draw, delay):
    r = retry(limit=3, backoff={"policy": "constant", "delay": "4s", "jitter": "1s"})
    d = after_run(r, RunEnd("Failed", 1), attempts=1, cancelled=False, deadline_passed=False, rand=fixed(draw))
    assert d.retry and d.delay == pytest.approx(delay)


def test_attempt_count_walks_up_to_the_limit():
    r = retry(limit=3, backoff={"policy": "exponential", "delay": "1s", "factor": 2})
    decisions = [
        after_run(r, RunEnd("Failed", 1), attempts=n, cancelled=False, deadline_passed=False, rand=fixed(MID))
        for n in (1, 2, 3, 4)
    ]
    assert [d.retry for d in decisions] == [True, True, True, False]
    assert [d.delay for d in decisions[:3]] == [1.0, 2.0, 4.0]
    assert (decisions[3].outcome, decisions[3].reason) == ("Failed", "BackoffLimitExceeded")


@pytest.mark.parametrize(
    ("run", "attempts", "cancelled", "deadline", "fragment"),
    [
        pytest.param(RunEnd("Failed", 2), 1, False, False, "exit code 2", id="names-exit-code"),
        pytest.param(RunEnd("Failed", 1), 4, False, False, "retry limit 3 reached", id="names-limit"),
        pytest.param(RunEnd("Failed", 1), 1, True, False, "cancelled", id="cancelled"),
        pytest.param(RunEnd("Failed", 1), 1, False, True, "timeout", id="deadline"),
    ],
)
def test_after_run_message_says_why(run, attempts, cancelled, deadline, fragment):
    r = retry(limit=3, onExitCodes=[1])
    d = after_run(r, run, attempts=attempts, cancelled=cancelled, deadline_passed=deadline, rand=fixed(MID))
    assert fragment in d.message


# --- restart_delay (services) ----------------------------------------------------------------


def restart(**fields) -> Restart:
    return Restart.model_validate(fields)


@pytest.mark.parametrize(
    ("lifetimes", "expected"),
    [
        pytest.param([0.1], (1.0, True, 1), id="first-crash-waits-delay"),
        pytest.param([0.1, 0.1], (2.0, True, 2), id="doubles"),
        pytest.param([0.1] * 4, (8.0, True, 4), id="doubles-again"),
        pytest.param([0.1] * 9, (60.0, True, 9), id="capped-at-maxDelay"),
        pytest.param([0.1] * 5000, (60.0, True, 5000), id="long-streak-no-overflow"),
        pytest.param([0.1, 0.1, 600.0], (1.0, False, 0), id="a-run-of-resetAfter-resets"),
        pytest.param([0.1, 600.0, 0.1], (1.0, True, 1), id="streak-counts-after-the-reset"),
        pytest.param([599.9], (1.0, True, 1), id="just-short-of-resetAfter"),
    ],
)
def test_restart_delay_doubles_per_short_run_and_resets_after_a_healthy_one(lifetimes, expected):
    got = restart_delay(restart(delay="1s", maxDelay="1m", resetAfter="10m"), lifetimes)
    assert (got.delay, got.crash_loop, got.streak) == expected


def test_a_restart_delay_stored_as_zero_still_backs_off():
    """A spec stored before apply refused delays under 100ms: it doubles from 100ms rather
    than restarting at once for ever (0 doubled is 0)."""
    zero = restart(delay="0s", maxDelay="0s")
    assert [restart_delay(zero, [0.1] * n).delay for n in (0, 1, 3)] == [0.1, 0.1, 0.1]
    doubling = restart(delay="0s", maxDelay="1s")
    assert [restart_delay(doubling, [0.1] * n).delay for n in (1, 2, 3, 5)] == [0.1, 0.2, 0.4, 1.0]


def test_a_service_restarts_whatever_its_retry_policy_says_but_not_after_a_failed_start():
    limit0 = retry(limit=0, onExitCodes=[2])
    for end in (RunEnd("Failed", 1), RunEnd("Succeeded", 0), RunEnd("Lost", reason="NodeLost")):
        d = after_run(limit0, end, attempts=50, cancelled=False, deadline_passed=False, rand=no_rand, restart=3.0)
        assert (d.retry, d.delay) == (True, 3.0), end
    failed_start = after_run(
        limit0, RunEnd("StartFailed"), attempts=1, cancelled=False, deadline_passed=False, rand=no_rand, restart=3.0
    )
    assert (failed_start.retry, failed_start.reason) == (False, "StartFailed")
    cancelled = after_run(
        limit0, RunEnd("Failed", 1), attempts=1, cancelled=True, deadline_passed=False, rand=no_rand, restart=3.0
    )
    assert (cancelled.retry, cancelled.outcome) == (False, "Cancelled")


@pytest.mark.parametrize(
    ("run", "restarted"),
    [
        pytest.param(RunEnd("StartFailed", reason="ArtifactInvalid", retryable=True), True, id="unreachable-restarts"),
        pytest.param(RunEnd("StartFailed", reason="ArtifactInvalid"), False, id="invalid-ends-the-service"),
        pytest.param(RunEnd("StartFailed"), False, id="start-failed-ends-the-service"),
    ],
)
def test_a_service_whose_artifact_cannot_be_reached_is_restarted_like_after_an_exit(run, restarted):
    d = after_run(retry(limit=0), run, attempts=5, cancelled=False, deadline_passed=False, rand=fixed(MID), restart=3.0)
    assert d.retry is restarted
    assert d.reason == (None if restarted else run.reason or "StartFailed")


@pytest.mark.parametrize(
    ("retry", "attempts", "reason"),
    [
        pytest.param(Retry(limit=0), 1, "OOMKilled", id="limit-reached"),
        pytest.param(Retry(limit=3, on_exit_codes=[1]), 1, "OOMKilled", id="137-not-retryable"),
    ],
)
def test_a_run_killed_at_its_memory_limit_names_the_job_s_reason(retry, attempts, reason):
    end = RunEnd("Failed", 137, reason="OOMKilled")
    decision = after_run(retry, end, attempts=attempts, cancelled=False, deadline_passed=False, rand=no_rand)
    assert (decision.retry, decision.outcome, decision.reason) == (False, "Failed", reason)


def test_a_run_killed_at_its_memory_limit_is_retried_like_any_failure():
    end = RunEnd("Failed", 137, reason="OOMKilled")
    decision = after_run(Retry(limit=1), end, attempts=1, cancelled=False, deadline_passed=False, rand=fixed(0.5))
    assert decision.retry


def test_messages_name_the_runs_own_number_not_its_place_in_the_revision():
    """After a rerun, the revision's first attempt is run 2: said as run 2 (the events and
    the run records say so), not run 1."""
    limit0, limit1 = Retry(limit=0), Retry(limit=1)
    ended = after_run(
        limit0, RunEnd("Failed", 1), attempts=1, number=2, cancelled=False, deadline_passed=False, rand=no_rand
    )
    assert ended.message == "run 2 ended Failed with exit code 1; retry limit 0 reached"
    retried = after_run(
        limit1, RunEnd("Failed", 1), attempts=1, number=3, cancelled=False, deadline_passed=False, rand=fixed(MID)
    )
    assert retried.message.startswith("run 3 ended Failed with exit code 1; retry 1 of 1 in")


def test_max_delay_caps_every_restart_delay_the_first_too():
    """As a spec is stored (its defaults written in, maxDelay 5m included), so read back: a
    delay above maxDelay is maxDelay, as README says."""
    assert restart_delay(restart(delay="10m"), [0.1]).delay == 300.0
    assert restart_delay(restart(delay="10m", maxDelay="20m"), [0.1]).delay == 600.0
