"""The retry budget's worst case against the deadline it must fit: pure arithmetic."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retries.backoff import retry_delay_seconds
from retries.budget import bounding_deadlines, check_task, longest_waits, platform_worst_case_seconds, seconds, worst_case_seconds

FAST = settings(deadline=None, max_examples=200)
ARGS = {"retries": 3, "execution_timeout": 60, "retry_delay": 30, "retry_backoff": "exponential", "retry_max_delay": 120, "infrastructure_retry_limit": 2}


def test_it_computes_the_documented_example():
    """retries 3, timeout 60, delay 30, cap 120: 240 + 30 + 60 + 120 = 450 s."""
    assert longest_waits(3, 30, "exponential", 120) == [30, 60, 120]
    assert worst_case_seconds(3, 60, 30, "exponential", 120) == 450


def test_it_caps_every_wait():
    assert longest_waits(6, 10, "exponential", 50) == [10, 20, 40, 50, 50, 50]
    assert worst_case_seconds(6, 1, 10, "exponential", 50) == 7 + 220


def test_fixed_backoff_waits_the_delay_each_time():
    assert longest_waits(4, 30, "fixed", 600) == [30, 30, 30, 30]
    assert worst_case_seconds(4, 10, 30, "fixed", 600) == 50 + 120


def test_fixed_backoff_is_its_delay_even_past_the_max_delay():
    assert longest_waits(2, 900, "fixed", 600) == [900, 900]


def test_no_retries_is_one_timeout():
    assert longest_waits(0, 30, "exponential", 120) == []
    assert worst_case_seconds(0, 45, 30, "exponential", 120) == 45


def test_the_issue_example_misses_an_hour():
    """5 retries, a 10-minute timeout, backoff up to 10 minutes: more than an hour and a half."""
    worst = worst_case_seconds(5, 600, 120, "exponential", 600)
    assert worst == 6 * 600 + 120 + 240 + 480 + 600 + 600
    assert worst > 5400 > 3600


@FAST
@given(
    retries=st.integers(min_value=0, max_value=30),
    retry_delay=st.floats(min_value=0, max_value=1e4, allow_nan=False),
    max_delay=st.floats(min_value=0, max_value=1e5, allow_nan=False),
    backoff=st.sampled_from(["exponential", "fixed"]),
    jitter=st.sampled_from(["full", "equal", "none"]),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_no_drawn_wait_exceeds_the_longest(retries, retry_delay, max_delay, backoff, jitter, seed):
    """Whatever the backoff, jitter and random draw, the real wait before retry n is at most
    the wait the check counts; `none` jitter waits exactly that."""
    rng = random.Random(seed)
    waits = longest_waits(retries, retry_delay, backoff, max_delay)
    for n, longest in enumerate(waits, start=1):
        drawn = retry_delay_seconds(n, retry_delay=retry_delay, backoff=backoff, max_delay=max_delay, jitter=jitter, rng=rng)
        assert 0 <= drawn <= longest
        if jitter == "none":
            assert drawn == longest
        assert longest <= (retry_delay if backoff == "fixed" else max_delay)


@FAST
@given(st.integers(min_value=0, max_value=20), st.floats(min_value=0, max_value=1e4, allow_nan=False))
def test_more_retries_never_shrink_the_worst_case(retries, timeout):
    assert worst_case_seconds(retries + 1, timeout, 5, "exponential", 100) >= worst_case_seconds(retries, timeout, 5, "exponential", 100)


def test_platform_worst_case():
    assert platform_worst_case_seconds(2, 60, 10, 30) == 2 * (60 + 30 + 10)
    assert platform_worst_case_seconds(0, 60, 10, 30) == 0


def test_bounding_deadlines_are_the_tasks_own_and_the_runs_queue_time():
    task = [{"reference": "task_started_at", "interval": 300}, {"reference": "task_queued_at", "interval": 500.5}]
    dag = [{"reference": "dagrun_queued_at", "interval": 3600}, {"reference": "dagrun_logical_date", "interval": 10}, {"reference": "average_runtime", "interval": 1}]
    assert bounding_deadlines(task, dag) == [
        ("task deadlines[0] (task_started_at + 300 s)", 300.0),
        ("task deadlines[1] (task_queued_at + 500.5 s)", 500.5),
        ("DAG deadlines[0] (dagrun_queued_at + 3600 s)", 3600.0),
    ]


def test_check_task_gives_a_verdict_per_bounding_deadline():
    verdicts = check_task("load", ARGS, [{"reference": "task_started_at", "interval": 300}], [{"reference": "dagrun_queued_at", "interval": 450}], infrastructure_retry_delay=10, detection_seconds=30)
    assert [(v.interval, v.worst_case, v.fits) for v in verdicts] == [(300, 450, False), (450, 450, True)]
    assert verdicts[0].platform_worst_case == 2 * (60 + 30 + 10)


def test_a_task_without_a_timeout_has_no_verdict():
    assert check_task("t", {**ARGS, "execution_timeout": None}, [{"reference": "task_started_at", "interval": 1}], [], infrastructure_retry_delay=10, detection_seconds=30) == []


@pytest.mark.parametrize(("value", "text"), [(450.0, "450"), (0.5, "0.5"), (3600, "3600")])
def test_seconds_are_written_plainly(value, text):
    assert seconds(value) == text


WORST = {"execution_timeout": 60, "retry_delay": 30, "backoff": "exponential", "max_delay": 120}


def test_a_task_not_started_has_the_whole_budget_ahead():
    from retries.budget import remaining_worst_case_seconds

    assert remaining_worst_case_seconds("none", try_number=0, max_tries=4, **WORST) == worst_case_seconds(3, 60, 30, "exponential", 120) == 450


def test_a_running_task_has_the_rest_of_its_try_and_the_tries_left():
    from retries.budget import remaining_worst_case_seconds

    # try 2 of 4, 20 s in: 40 s left, then wait 60 + try 3, wait 120 + try 4.
    assert remaining_worst_case_seconds("running", try_number=2, max_tries=4, running_for=20, **WORST) == 40 + 60 + 60 + 120 + 60
    # the last try, past its timeout: nothing left.
    assert remaining_worst_case_seconds("running", try_number=4, max_tries=4, running_for=90, **WORST) == 0


def test_a_task_up_for_retry_waits_then_runs_the_tries_left():
    from retries.budget import remaining_worst_case_seconds

    # try 1 failed, 10 s of its wait left: try 2, then wait 60 + try 3, wait 120 + try 4.
    assert remaining_worst_case_seconds("up_for_retry", try_number=1, max_tries=4, wait_left=10, **WORST) == 10 + 60 + 60 + 60 + 120 + 60
