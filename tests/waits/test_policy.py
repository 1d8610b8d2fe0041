"""The waiting rules (retries/policy.py): pure, no database."""
from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from retries.context import ExecutionContext
from retries.policy import Budget, PlatformSettings, RetryArgs, check_phase, decide, next_check, rescheduled
from retries.states import CLEAR_FROM, IN_FLIGHT_TASK_STATES, MARK_FAILED_FROM, MARK_SUCCESS_FROM, Reason, Source, TaskState

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ARGS = RetryArgs(retry_delay=1, retry_backoff="fixed", retry_max_delay=10, retry_jitter="none", infrastructure_retry_limit=5, poison_threshold=0)
PLATFORM = PlatformSettings(infrastructure_retry_delay=0, pre_execution_retries=1, pre_execution_excluded_reasons=frozenset())


def test_a_reschedule_waits_exactly_its_delay():
    step = rescheduled(since=NOW, now=NOW, delay=30, wait_timeout=3600)
    assert not step.timed_out
    assert step.next_check_at == NOW + timedelta(seconds=30)


def test_a_reschedule_past_the_timeout_times_out_and_one_ending_past_it_is_cut_to_it():
    assert rescheduled(since=NOW - timedelta(hours=2), now=NOW, delay=1, wait_timeout=3600).timed_out
    step = rescheduled(since=NOW - timedelta(seconds=3590), now=NOW, delay=60, wait_timeout=3600)
    assert not step.timed_out
    assert step.next_check_at == NOW + timedelta(seconds=10)


def test_the_next_check_is_a_poke_interval_on_or_when_a_time_is_met():
    assert next_check(since=NOW, now=NOW, poke_interval=60, wait_timeout=3600).next_check_at == NOW + timedelta(seconds=60)
    met = NOW + timedelta(seconds=5)
    assert next_check(since=NOW, now=NOW, poke_interval=60, wait_timeout=3600, met_at=met).next_check_at == met
    # an event or an approval: looked at only at its timeout
    assert next_check(since=NOW, now=NOW, poke_interval=60, wait_timeout=3600, checked=False).next_check_at == NOW + timedelta(hours=1)
    assert next_check(since=NOW - timedelta(hours=2), now=NOW, poke_interval=60, wait_timeout=3600).timed_out


def test_wait_failures_and_rejections_are_not_retried_whatever_tries_are_left():
    budget = Budget(try_number=1, max_tries=5, infrastructure_try_number=0)
    for reason in (Reason.WAIT_TIMEOUT, Reason.WAIT_FAILED, Reason.REJECTED):
        decision = decide(ExecutionContext.of(reason, Source.SCHEDULER), budget, ARGS, PLATFORM, now=NOW, rng=random.Random(1))
        assert decision.next_state is TaskState.FAILED, reason


def test_a_waiting_task_is_in_flight_and_operators_may_clear_or_mark_it():
    state = TaskState.UP_FOR_RESCHEDULE
    assert state in IN_FLIGHT_TASK_STATES
    assert state in CLEAR_FROM
    assert state in MARK_SUCCESS_FROM
    assert state in MARK_FAILED_FROM


@settings(max_examples=300, deadline=None)
@given(
    now=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    poke_interval=st.floats(min_value=0.0, max_value=86400 * 7, allow_nan=False),
    key=st.integers(min_value=1, max_value=2**63 - 1),
)
def test_a_phased_check_is_never_more_than_one_poke_interval_on_and_then_exactly_one(now, poke_interval, key):
    interval = timedelta(seconds=max(1.0, poke_interval))
    phase = check_phase(key)
    assert 0 <= phase < 1
    at = next_check(since=now, now=now, poke_interval=poke_interval, wait_timeout=86400 * 30, phase=phase).next_check_at
    assert now < at <= now + interval
    # Checked on time, the next one is one interval on (to the microsecond the interval is kept in).
    then = next_check(since=now, now=at, poke_interval=poke_interval, wait_timeout=86400 * 30, phase=phase).next_check_at
    assert abs((then - at) - interval) <= timedelta(microseconds=1)
    # Checked late, the next one is still at most one interval after that check.
    late = at + interval * 0.7
    after = next_check(since=now, now=late, poke_interval=poke_interval, wait_timeout=86400 * 30, phase=phase).next_check_at
    assert late < after <= late + interval


def test_waits_checked_together_are_due_again_spread_over_the_interval():
    """10,000 waits (consecutive ids) checked at the same instant: in any one second of the next
    minute about 10,000/60 of them are due, not all of them in one."""
    due = Counter()
    for key in range(1, 10_001):
        at = next_check(since=NOW, now=NOW, poke_interval=60, wait_timeout=3600, phase=check_phase(key)).next_check_at
        due[int((at - NOW).total_seconds())] += 1
    assert max(due.values()) <= 10_000 / 60 * 1.1
    assert len(due) == 60
    # A time that is met sooner still comes first; the timeout still bounds it.
    met = NOW + timedelta(seconds=5)
    assert next_check(since=NOW, now=NOW, poke_interval=60, wait_timeout=3600, met_at=met, phase=0.99).next_check_at == met
    assert next_check(since=NOW, now=NOW, poke_interval=60, wait_timeout=30, phase=0.99).next_check_at == NOW + timedelta(seconds=30)
