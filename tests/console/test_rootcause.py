"""The root cause of a task's failure, read from its attempts: pure rules, no database."""
from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from orchestrator.console import rootcause
from orchestrator.console.charts import bucket_starts, failures_over_time

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=dt_timezone.utc)
APP = {"category": "application", "reason": "task_exception", "metadata": {"exception_type": "FileNotFoundError", "message": "config file missing"}}
LOST = {"category": "infrastructure", "reason": "worker_lost", "metadata": {}}
MARKED = {"category": "user_action", "reason": "manual_mark_failed", "at": (T0 + timedelta(minutes=9)).isoformat(),
          "metadata": {"user": "alice", "note": "ledger closed", "prior_state": "dead_letter"}}


def attempt(number: int, context: dict, *, kind: str = "user", state: str = "failed", try_number: int | None = None, infra: int = 0, ran: float = 0.007) -> rootcause.AttemptFacts:
    start = T0 + timedelta(minutes=number)
    return rootcause.AttemptFacts(
        token=number, number=number, kind=kind, state=state, try_number=try_number or number, infrastructure_try_number=infra,
        context=context, start=start, end=start + timedelta(seconds=ran), stderr_tail="",
    )


def test_the_cause_is_the_last_failed_attempt_not_the_operators_action():
    attempts = [attempt(1, APP), attempt(2, APP), attempt(3, MARKED, try_number=3)]  # a mark failed that stopped a running attempt
    cause = rootcause.root_cause(attempts, MARKED, max_tries=3, infrastructure_retry_limit=5, tipped=set())
    assert (cause.category, cause.reason, cause.error, cause.attempt_number) == ("application", "task_exception", "FileNotFoundError: config file missing", 2)
    assert cause.budget == "user try 2 of 3"


def test_the_action_reads_as_an_action():
    action = rootcause.operator_action(MARKED)
    assert (action.words, action.user, action.note, action.prior_state) == ("marked failed", "alice", "ledger closed", "dead_letter")
    assert rootcause.operator_action(APP) is None


def test_poisoned_belongs_to_the_attempt_that_tipped_the_task():
    attempts = [attempt(1, APP), attempt(2, APP)]
    assert rootcause.tipping_tokens(attempts, "dead_letter", []) == {2}
    # marked failed afterwards: the audit row's time finds the same attempt
    assert rootcause.tipping_tokens(attempts, "failed", [T0 + timedelta(minutes=9)]) == {2}
    # cleared, then failed again differently: the new failure is not the poisoned one
    later = [*attempts, attempt(3, LOST, kind="platform", infra=1)]
    tipped = rootcause.tipping_tokens(later, "failed", [T0 + timedelta(minutes=2, seconds=30)])
    assert tipped == {2}
    cause = rootcause.root_cause(later, MARKED, max_tries=5, infrastructure_retry_limit=5, tipped=tipped)
    assert not cause.poisoned
    assert (cause.budget, cause.charged) == ("user try 3 of 5", "the platform")


def test_one_numbering_what_an_attempt_was_and_what_its_failure_used():
    # attempt 1 (user try 1) lost its worker: the platform paid, attempt 2 repeats try 1
    assert rootcause.attempt_label("", 1, 0, 3, 5) == "user try 1 of 3"
    assert rootcause.spent_label("platform", 1, 0, 3, 5) == "platform retry 1 of 5"
    assert rootcause.attempt_label("platform", 1, 1, 3, 5) == "platform retry 1 of 5"
    # attempt 2 failed in the task's code: its own try paid
    assert rootcause.spent_label("user", 1, 1, 3, 5) == "user try 1 of 3"
    assert rootcause.attempt_label("user", 2, 1, 3, 5) == "user try 2 of 3"


def test_the_run_time_is_the_attempts_not_the_time_between_actions():
    attempts = [attempt(1, APP, ran=0.004), attempt(2, APP, ran=0.003)]
    assert abs(rootcause.attempts_seconds(attempts, T0 + timedelta(hours=1)) - 0.007) < 1e-9
    assert rootcause.attempts_seconds([], T0) is None


def test_a_failure_without_an_attempt_is_read_from_the_task():
    lost = {"category": "infrastructure", "reason": "queue_lost", "metadata": {}}
    cause = rootcause.root_cause([], lost, max_tries=3, infrastructure_retry_limit=5, tipped=set())
    assert (cause.category, cause.reason, cause.attempt_number) == ("infrastructure", "queue_lost", None)
    assert rootcause.root_cause([], MARKED, max_tries=3, infrastructure_retry_limit=5, tipped=set()) is None


def test_the_chart_has_every_bucket_of_the_window():
    now = T0 + timedelta(minutes=20)
    assert len(bucket_starts(now - timedelta(hours=24), now, timedelta(hours=1))) == 25
    assert len(bucket_starts(now - timedelta(hours=1), now, timedelta(minutes=1))) == 61
    chart = failures_over_time({(T0, "application"): 2, (T0, "infrastructure"): 1}, since=now - timedelta(hours=24), until=now,
                               step=timedelta(hours=1), fmt="%d %H:00", window="24h")
    assert len(chart.bars) == 25
    assert chart.top == 3
    assert chart.total == 3
    last = chart.bars[-1]
    assert [s.category for s in last.segments] == ["infrastructure", "application"]  # stacked bottom-up
    assert last.title == "24 10:00: 3 (1 infrastructure, 2 application)"
    assert chart.categories == ["infrastructure", "application", "timeout"]
    assert 3 <= len(chart.ticks) <= 8
    assert all(t.label.endswith(":00") for t in chart.ticks)
