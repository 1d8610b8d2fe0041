"""The waiting rules (retries/policy.py): pure, no database."""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from retries.context import ExecutionContext
from retries.policy import Budget, PlatformSettings, RetryArgs, decide, next_check, rescheduled
from retries.states import CLEAR_FROM, IN_FLIGHT_TASK_STATES, MARK_FAILED_FROM, MARK_SUCCESS_FROM, Reason, Source, TaskState

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ARGS = RetryArgs(retry_delay=1, retry_backoff="fixed", retry_max_delay=10, retry_jitter="none", infrastructure_retry_limit=5, poison_threshold=0)
PLATFORM = PlatformSettings(infrastructure_retry_delay=0, pre_execution_retries=1, pre_execution_excluded_reasons=frozenset())


def test_a_reschedule_waits_exactly_its_delay():
    step = rescheduled(since=NOW, now=NOW, delay=30, wait_timeout=3600)
    assert not step.timed_out and step.next_check_at == NOW + timedelta(seconds=30)


def test_a_reschedule_past_the_timeout_times_out_and_one_ending_past_it_is_cut_to_it():
    assert rescheduled(since=NOW - timedelta(hours=2), now=NOW, delay=1, wait_timeout=3600).timed_out
    step = rescheduled(since=NOW - timedelta(seconds=3590), now=NOW, delay=60, wait_timeout=3600)
    assert not step.timed_out and step.next_check_at == NOW + timedelta(seconds=10)


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
    assert state in IN_FLIGHT_TASK_STATES and state in CLEAR_FROM and state in MARK_SUCCESS_FROM and state in MARK_FAILED_FROM
