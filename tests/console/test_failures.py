"""The failures page's figures: hourly counts kept as attempts fail, plus the window's partial
first hour read from the attempts, equal a raw count of the failed attempts every way."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.console import failures
from orchestrator.engine import failure_counts
from orchestrator.engine.reporting import report_failure
from orchestrator.models import FailureCount, TaskAttempt, TaskInstance
from orchestrator.operations import actions
from retries.context import ExecutionContext
from retries.states import Reason, Source
from tests.api.factories import chain_dag, instance, make_run, start

pytestmark = pytest.mark.django_db

# Not on a whole hour, so a window from here has a partial first hour.
NOW = datetime(2026, 11, 24, 10, 20, 30, tzinfo=dt_timezone.utc)


def fail_at(run, task_id: str, at: datetime, reason: Reason = Reason.TASK_EXCEPTION, *, fingerprint: str | None = "4a7c1d9e02bb") -> TaskInstance:
    """One attempt of the task, failed at `at` the way a worker reports it."""
    ti = start(run, task_id)
    context = ExecutionContext.of(reason, Source.WORKER, exception_type="ValueError")
    assert report_failure(ti.pk, ti.attempt_token, context, fingerprint=fingerprint if reason == Reason.TASK_EXCEPTION else None, now=at)
    return instance(run, task_id)


def raw(flt: failures.Filter, now: datetime = NOW) -> tuple[dict[str, Counter], Counter]:
    """Every breakdown and the chart's bars (by bucket and category), counted in Python from the failed attempts."""
    since = flt.since(now)
    rows = [
        a for a in TaskAttempt.objects.select_related("task_instance__dag_run__dag").filter(state="failed", end_date__gte=since)
        if (not flt.category or a.context["category"] == flt.category) and (not flt.dag_id or a.task_instance.dag_run.dag.dag_id == flt.dag_id)
    ]
    keys = {
        "Category": lambda a: a.context["category"],
        "Reason": lambda a: a.context["reason"],
        "DAG": lambda a: a.task_instance.dag_run.dag.dag_id,
        "Task": lambda a: a.task_instance.task_id,
        "Worker host": lambda a: a.hostname,
        "Fingerprint": lambda a: a.fingerprint or "",
    }
    counts = {title: Counter(key(a) for a in rows) for title, key in keys.items()}
    _, _, fmt = failures.WINDOWS[flt.window]
    day = flt.window in ("7d", "30d")
    buckets = Counter(
        (a.end_date.astimezone(dt_timezone.utc).replace(minute=0, second=0, microsecond=0, **({"hour": 0} if day else {})).strftime(fmt), a.context["category"])
        for a in rows
    )
    return counts, buckets


def shown(flt: failures.Filter, now: datetime = NOW) -> tuple[dict[str, Counter], Counter]:
    page = failures.page(flt, now)
    _, _, fmt = failures.WINDOWS[flt.window]
    bars = Counter({(bar.start.strftime(fmt), seg.category): seg.n for bar in page["chart"].bars for seg in bar.segments})
    return {title: Counter({c.key: c.n for c in rows}) for title, rows in page["counts"].items()}, bars


def assert_page_equals_raw_count(now: datetime = NOW) -> None:
    for flt in [
        failures.Filter(window="24h"),
        failures.Filter(window="6h"),
        failures.Filter(window="7d"),
        failures.Filter(window="24h", category="application"),
        failures.Filter(window="24h", dag_id="ops"),
    ]:
        assert shown(flt, now) == raw(flt, now), flt
        assert failures.page(flt, now)["total"] == sum(raw(flt, now)[0]["Category"].values())


@pytest.fixture
def history():
    """Failures before the 24h window, in its partial first hour, on its first whole hour, and later."""
    etl, ops = make_run(chain_dag("etl", retries=30)), make_run(chain_dag("ops", retries=30))
    since = NOW - timedelta(hours=24)  # 10:20:30 yesterday; the first whole hour is 11:00
    for at, run, reason in [
        (since - timedelta(minutes=5), etl, Reason.TASK_EXCEPTION),  # outside the window, same hour as the next two
        (since + timedelta(minutes=1), etl, Reason.TASK_EXCEPTION),  # partial first hour
        (since + timedelta(minutes=30), ops, Reason.WORKER_LOST),  # partial first hour
        (since + timedelta(minutes=39, seconds=30), etl, Reason.EXECUTION_TIMEOUT),  # 11:00:00 exactly
        (NOW - timedelta(hours=5), etl, Reason.TASK_EXCEPTION),  # 6h window: its partial first hour
        (NOW - timedelta(hours=3), ops, Reason.TASK_EXCEPTION),
        (NOW - timedelta(minutes=2), etl, Reason.WORKER_LOST),
    ]:
        fail_at(run, "extract", at, reason)
    return etl, ops


def test_each_failure_is_counted_once_in_its_hour(history):
    """The counts equal a GROUP BY of the failed attempts by hour and key."""
    expected = Counter()
    for a in TaskAttempt.objects.select_related("task_instance__dag_run").filter(state="failed"):
        hour = a.end_date.astimezone(dt_timezone.utc).replace(minute=0, second=0, microsecond=0)
        key = (hour, a.task_instance.dag_run.dag_id, a.task_instance.task_id, a.context["category"], a.context["reason"], a.hostname, a.fingerprint or "")
        expected[key] += 1
    kept = Counter({(c.hour, c.dag_id, c.task_id, c.category, c.reason, c.hostname, c.fingerprint): c.n for c in FailureCount.objects.all()})
    assert kept == expected
    assert sum(kept.values()) == 7


def test_the_page_equals_a_raw_count_every_way(history):
    """Every breakdown, the chart and the total, over windows whose first hour is partial."""
    assert_page_equals_raw_count()
    counts, bars = shown(failures.Filter(window="24h"))
    assert sum(counts["Category"].values()) == 6  # the one before the window is left out
    # the partial first hour, read from the attempts, stacked by category
    assert bars[("23 10:00", "application")] == 1
    assert bars[("23 10:00", "infrastructure")] == 1
    chart = failures.page(failures.Filter(window="24h"), NOW)["chart"]
    assert len(chart.bars) == 25  # every hour of the window, 10:00 yesterday to 10:00 today, empty ones too
    assert chart.bars[0].title == "23 10:00: 2 (1 infrastructure, 1 application)"
    assert chart.bars[1].title == "23 11:00: 1 (1 timeout)"
    assert chart.bars[2].title == "23 12:00: 0 (no failures)"


def test_a_reclassify_moves_the_count_to_the_new_reason(history, alice):
    etl, _ = history
    before = FailureCount.objects.filter(reason="operator_reclassified").count()
    actions.reclassify(instance(etl, "extract"), alice, note="node drained")
    assert before == 0
    assert FailureCount.objects.get(reason="operator_reclassified").n == 1
    assert_page_equals_raw_count()
    assert shown(failures.Filter(window="24h"))[0]["Reason"]["operator_reclassified"] == 1


def test_a_mark_failed_of_a_running_task_is_counted(history, alice):
    etl, _ = history
    start(etl, "extract")
    actions.mark_failed(instance(etl, "extract"), alice)
    # it ended at the real time, not at NOW: look from just after it
    later = TaskAttempt.objects.get(context__reason="manual_mark_failed").end_date + timedelta(seconds=1)
    assert_page_equals_raw_count(later)
    assert shown(failures.Filter(window="24h"), later)[0]["Reason"]["manual_mark_failed"] == 1


def test_a_mark_failed_of_a_task_that_is_not_running_counts_nothing(history, alice):
    etl, _ = history
    kept = sum(FailureCount.objects.values_list("n", flat=True))
    actions.mark_failed(instance(etl, "transform"), alice)  # never ran: no attempt ends
    assert sum(FailureCount.objects.values_list("n", flat=True)) == kept


def test_the_reason_filter_and_the_1h_window_count_the_attempts(history):
    """The counts cannot tell a dead-lettered task's own reason, nor minutes: those scan the attempts."""
    assert failures.page(failures.Filter(window="24h", reason="worker_lost"), NOW)["total"] == 2
    assert failures.page(failures.Filter(window="1h"), NOW)["total"] == 1


def test_backfill_counts_what_failed_before_the_table(history):
    kept = sorted(FailureCount.objects.values_list("hour", "dag_id", "task_id", "category", "reason", "hostname", "fingerprint", "n"))
    FailureCount.objects.all().delete()
    failure_counts.backfill()
    assert sorted(FailureCount.objects.values_list("hour", "dag_id", "task_id", "category", "reason", "hostname", "fingerprint", "n")) == kept


def test_a_failure_report_adds_one_statement(history):
    """The count is one upsert in the report's transaction."""
    etl, _ = history
    ti = start(etl, "extract")
    context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="ValueError")
    with CaptureQueriesContext(connection) as queries:
        report_failure(ti.pk, ti.attempt_token, context, fingerprint="4a7c1d9e02bb", now=NOW)
    assert len([q for q in queries.captured_queries if "orchestrator_failurecount" in q["sql"]]) == 1


def test_the_page_reads_a_bounded_number_of_queries(bob_client, history, django_assert_max_num_queries):
    with django_assert_max_num_queries(4):  # session, user, the counts, the newest rows
        assert bob_client.get("/failures/").status_code == 200


def test_deleting_a_dag_deletes_its_counts(history):
    etl, _ = history
    etl.dag.delete()
    assert set(FailureCount.objects.values_list("dag__dag_id", flat=True)) == {"ops"}
    assert_page_equals_raw_count()
