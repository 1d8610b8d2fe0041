"""The at-risk estimate never exceeds what a task's retry budget still allows."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from deadlines import risk
from orchestrator.engine.run_creation import create_run
from orchestrator.models import TaskAttempt, TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db


def history(dag, task_id: str, seconds: float, count: int = 3) -> None:
    """`count` past successes of `task_id` that took `seconds` each."""
    end = timezone.now() - timedelta(days=1)
    for i in range(count):
        run = create_run(dag, run_type="manual", logical_date=end - timedelta(hours=i + 1))
        ti = TaskInstance.objects.get(dag_run=run, task_id=task_id)
        TaskInstance.objects.filter(pk=ti.pk).update(state="success")
        TaskAttempt.objects.create(task_instance=ti, attempt_token=1, try_number=1, infrastructure_try_number=0, state="success",
                                   queued_at=end, start_date=end - timedelta(seconds=seconds), end_date=end)  # fmt: skip


def test_a_running_task_on_its_last_try_needs_at_most_what_its_timeout_leaves():
    dag = DagFactory(default_args={"retries": 0, "execution_timeout": 120})
    TaskFactory(dag=dag, task_id="load")
    history(dag, "load", 1000)  # it used to be slow (before it had a timeout)
    now = timezone.now()
    run = create_run(dag, run_type="manual", logical_date=now)
    TaskInstance.objects.filter(dag_run=run).update(state="running", try_number=1, max_tries=1, start_date=now - timedelta(seconds=100))
    assert risk.estimate_run(run, now) == pytest.approx(20)


def test_without_a_timeout_the_history_stands():
    dag = DagFactory(default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="load")
    history(dag, "load", 1000)
    now = timezone.now()
    run = create_run(dag, run_type="manual", logical_date=now)
    TaskInstance.objects.filter(dag_run=run).update(state="running", try_number=1, start_date=now - timedelta(seconds=100))
    assert risk.estimate_run(run, now) == pytest.approx(900)


def test_a_budget_larger_than_the_history_leaves_the_history():
    dag = DagFactory(default_args={"retries": 3, "execution_timeout": 600, "retry_delay": 30})
    TaskFactory(dag=dag, task_id="load")
    history(dag, "load", 50)
    now = timezone.now()
    run = create_run(dag, run_type="manual", logical_date=now)
    assert risk.estimate_run(run, now) == pytest.approx(50)
