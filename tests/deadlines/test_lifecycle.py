"""Deadline rows follow the engine: created when a run or task reaches its reference, settled when it finishes."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rq.job import Job

from orchestrator.engine import reporting
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run, create_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import DagRun, TaskInstance
from tests.deadlines.factories import DeadlineDefinitionFactory, chain_dag

pytestmark = pytest.mark.django_db


def run_all_tasks(run: DagRun) -> None:
    """Drive every task of `run` through the engine's own report functions, in order."""
    while True:
        advance_run(run.pk)
        ti = TaskInstance.objects.filter(dag_run=run, state="queued").first()
        if ti is None:
            return
        assert reporting.mark_running(ti.pk, ti.attempt_token)
        assert reporting.report_success(ti.pk, ti.attempt_token)


def test_it_creates_dag_deadlines_when_a_run_is_created():
    """A manual run gets its DAG-level deadlines at once; its logical date is its trigger time."""
    dag = chain_dag("report")
    DeadlineDefinitionFactory(dag=dag, reference="dagrun_queued_at", interval=60)
    DeadlineDefinitionFactory(dag=dag, reference="dagrun_logical_date", interval=120)
    now = timezone.now()
    run = create_manual_run(dag, now=now)
    rows = {d.reference: d for d in run.deadlines.all()}
    assert rows["dagrun_queued_at"].need_by == now + timedelta(seconds=60)
    assert rows["dagrun_logical_date"].need_by == now + timedelta(seconds=120)
    assert {(d.scope, d.task_id, d.state, d.callback_state) for d in rows.values()} == {("dag", None, "pending", None)}


def test_it_resolves_fixed_datetime_in_the_dag_timezone():
    """A naive fixed datetime stays 9 AM in the DAG's timezone, whatever the run."""
    dag = chain_dag("fixed", timezone="Europe/Amsterdam")
    DeadlineDefinitionFactory(dag=dag, reference="fixed_datetime", interval=0, datetime_text="2026-07-01T09:00:00")
    run = create_run(dag, run_type="manual", logical_date=datetime(2026, 7, 1, tzinfo=UTC))
    assert run.deadlines.get().need_by == datetime(2026, 7, 1, 7, 0, tzinfo=UTC)


def test_it_creates_no_deadline_outside_its_days_and_skip_dates():
    """days and skip_dates are read on the logical date in the DAG's timezone: no row when excluded."""
    dag = chain_dag("weekdays", timezone="Europe/Amsterdam")
    DeadlineDefinitionFactory(dag=dag, days=["mon", "tue", "wed", "thu", "fri"], skip_dates=["2026-12-25"])
    saturday = create_run(dag, run_type="scheduled", logical_date=datetime(2026, 11, 20, 23, 30, tzinfo=UTC))
    christmas = create_run(dag, run_type="scheduled", logical_date=datetime(2026, 12, 25, 8, tzinfo=UTC))
    monday = create_run(dag, run_type="scheduled", logical_date=datetime(2026, 11, 23, 8, tzinfo=UTC))
    assert not saturday.deadlines.exists()
    assert not christmas.deadlines.exists()
    assert monday.deadlines.count() == 1


def test_it_waits_for_enough_successful_runs_before_an_average_runtime_deadline():
    """average_runtime applies from the third successful run on: queued time + mean duration + interval."""
    dag = chain_dag("average")
    DeadlineDefinitionFactory(dag=dag, reference="average_runtime", interval=5)
    base = timezone.now() - timedelta(days=1)
    for i, seconds in enumerate((10, 20)):
        start = base + timedelta(hours=i)
        DagRun.objects.create(dag=dag, run_id=f"old{i}", state="success", logical_date=start, queued_at=start,
                              start_date=start, end_date=start + timedelta(seconds=seconds))
    assert not create_manual_run(dag).deadlines.exists()
    start = base + timedelta(hours=3)
    DagRun.objects.create(dag=dag, run_id="old3", state="success", logical_date=start, queued_at=start,
                          start_date=start, end_date=start + timedelta(seconds=30))
    now = timezone.now()
    run = create_run(dag, run_type="manual", logical_date=now, now=now)
    assert run.deadlines.get().need_by == now + timedelta(seconds=20 + 5)


def test_a_dispatch_of_many_creates_queued_deadlines_for_those_that_have_them():
    """The dispatch's own statement says which of its tasks have task_queued_at definitions: only
    theirs are created, and no other read is made for the rest."""
    from tests.engine.factories import DagFactory, TaskFactory

    dag = DagFactory(dag_id="mixed_queued")
    watched = TaskFactory(dag=dag, task_id="watched")
    for task_id in ("plain1", "plain2"):
        TaskFactory(dag=dag, task_id=task_id)
    DeadlineDefinitionFactory(dag=dag, task=watched, reference="task_queued_at", interval=30)
    run = create_manual_run(dag)
    advance_run(run.pk)
    assert TaskInstance.objects.filter(dag_run=run, state="queued").count() == 3
    assert [(d.task_id, d.reference) for d in run.deadlines.all()] == [("watched", "task_queued_at")]


def test_it_creates_task_deadlines_at_the_first_dispatch_and_start_only():
    """task_queued_at and task_started_at rows appear when the task reaches them, once per task instance."""
    dag = chain_dag("tasky", ("extract",))
    task = dag.tasks.get()
    DeadlineDefinitionFactory(dag=dag, task=task, reference="task_queued_at", interval=30)
    DeadlineDefinitionFactory(dag=dag, task=task, reference="task_started_at", interval=600, callback="notifier:email")
    run = create_run(dag, run_type="manual", logical_date=timezone.now())  # created, not started
    assert not run.deadlines.exists()
    advance_run(run.pk)
    ti = TaskInstance.objects.get(dag_run=run)
    queued = run.deadlines.get()
    assert (queued.scope, queued.task_id, queued.reference) == ("task", "extract", "task_queued_at")
    assert queued.need_by == ti.queued_at + timedelta(seconds=30)
    assert reporting.mark_running(ti.pk, ti.attempt_token)
    ti.refresh_from_db()
    started = run.deadlines.get(reference="task_started_at")
    assert started.need_by == ti.start_date + timedelta(seconds=600)
    assert started.callback == "notifier:email"
    # A platform retry dispatches and starts the task again: the clocks keep their first start.
    TaskInstance.objects.filter(pk=ti.pk).update(state="scheduled")
    advance_run(run.pk)
    ti.refresh_from_db()
    assert reporting.mark_running(ti.pk, ti.attempt_token)
    assert run.deadlines.count() == 2


def test_it_marks_deadlines_met_when_the_run_finishes_in_time():
    """A run (and task) finishing before need-by marks its deadlines met, with negative lateness."""
    dag = chain_dag("on_time", ("a", "b"))
    DeadlineDefinitionFactory(dag=dag, interval=3600)
    DeadlineDefinitionFactory(dag=dag, task=dag.tasks.get(task_id="b"), reference="task_started_at", interval=3600)
    run = create_manual_run(dag)
    run_all_tasks(run)
    run.refresh_from_db()
    assert run.state == "success"
    rows = list(run.deadlines.all())
    assert len(rows) == 2
    assert {d.state for d in rows} == {"met"}
    assert all(d.lateness_seconds < 0 and d.resolved_at is not None and d.callback_state is None for d in rows)


def test_it_marks_a_late_finish_missed_and_queues_its_callback(django_capture_on_commit_callbacks):
    """A run that finishes after need-by before any check noticed is still missed, and called back once."""
    dag = chain_dag("late")
    DeadlineDefinitionFactory(dag=dag, interval=60)
    long_ago = timezone.now() - timedelta(hours=2)
    run = create_run(dag, run_type="manual", logical_date=long_ago, now=long_ago)
    with django_capture_on_commit_callbacks(execute=True):
        run_all_tasks(run)
    deadline = run.deadlines.get()
    assert (deadline.state, deadline.callback_state, deadline.callback_attempts) == ("missed", "queued", 1)
    assert deadline.lateness_seconds == pytest.approx(7200 - 60, abs=60)
    job = Job.fetch(f"deadline-{deadline.pk}-missed-1", connection=get_redis())
    assert job.func_name == "deadlines.callbacks.run_callback"
    assert job.args == (deadline.pk, "missed", 1)
