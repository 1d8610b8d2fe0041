"""The scheduler creates a DAG's runs from its cron schedule, in its timezone."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import Dag, DagRun
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)

UTC = timezone.utc


def _logical_dates(dag: Dag) -> list[datetime]:
    return list(DagRun.objects.filter(dag=dag, run_type="scheduled").order_by("logical_date").values_list("logical_date", flat=True))


def test_it_creates_each_due_run_once_in_the_dags_timezone():
    """A daily 02:00 Amsterdam DAG: nothing before the tick, one run after it, none twice."""
    dag = DagFactory(schedule="0 2 * * *", timezone="Europe/Amsterdam", max_active_runs=5)
    TaskFactory(dag=dag, task_id="t")
    schedule_once(datetime(2026, 7, 10, 12, 0, tzinfo=UTC))  # computes the first tick, creates nothing
    dag.refresh_from_db()
    assert dag.next_run_logical_date == datetime(2026, 7, 11, 0, 0, tzinfo=UTC)  # 02:00 CEST
    assert _logical_dates(dag) == []
    schedule_once(datetime(2026, 7, 10, 23, 59, tzinfo=UTC))
    assert _logical_dates(dag) == []
    schedule_once(datetime(2026, 7, 11, 0, 0, 1, tzinfo=UTC))
    schedule_once(datetime(2026, 7, 11, 0, 0, 2, tzinfo=UTC))
    assert _logical_dates(dag) == [datetime(2026, 7, 11, 0, 0, tzinfo=UTC)]
    run = DagRun.objects.get(dag=dag)
    assert run.run_id == "scheduled__2026-07-11T00:00:00+00:00"
    assert run.state == "running"


def test_it_runs_only_the_latest_missed_tick_without_catchup_and_every_tick_with_it():
    """After three missed hours, catchup=false makes one run for the latest; catchup=true makes them all."""
    start = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)
    lazy = DagFactory(schedule="@hourly", catchup=False, next_run_logical_date=start)
    eager = DagFactory(schedule="@hourly", catchup=True, next_run_logical_date=start, max_active_runs=10)
    for dag in (lazy, eager):
        TaskFactory(dag=dag, task_id="t")
    now = datetime(2026, 3, 1, 3, 30, tzinfo=UTC)
    for _ in range(5):
        schedule_once(now)
    assert _logical_dates(lazy) == [datetime(2026, 3, 1, 3, tzinfo=UTC)]
    assert _logical_dates(eager) == [datetime(2026, 3, 1, hour, tzinfo=UTC) for hour in range(4)]


def test_it_creates_no_runs_for_a_paused_dag():
    """Pausing stops scheduled runs."""
    dag = DagFactory(schedule="@hourly", paused=True, next_run_logical_date=datetime(2026, 3, 1, tzinfo=UTC))
    TaskFactory(dag=dag, task_id="t")
    schedule_once(datetime(2026, 3, 1, 5, tzinfo=UTC))
    assert _logical_dates(dag) == []
