"""A backlog far longer than the timeouts: tasks that only wait their turn are never presumed
lost, on real workers with short timings (queued timeout 1 s, heartbeat timeout 2 s)."""
from __future__ import annotations

import pytest

from orchestrator.models import Task, TaskAttempt
from tests.faults.conftest import settle_runs
from tests.worker.conftest import trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

PRESUMED_LOST = {"pre_execution_failure", "queue_lost", "worker_lost"}
WIDTH = 600


@pytest.mark.timeout(900)
def test_a_backlog_of_no_op_tasks_is_never_presumed_lost(worker, make_dag, settings):
    """root -> 600 no-op tasks -> sink on two workers of 8 slots: the jobs wait in their queue
    far longer than the queued timeout, scheduler passes look at them all the while, and not one
    attempt is charged to the platform."""
    settings.ORCHESTRATOR_QUEUED_TIMEOUT = 1
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT = 2
    noop = {"python_callable": "tests.worker.tasks.succeed"}
    dag = make_dag([{"task_id": "root", **noop}])
    middle = [f"m{i}" for i in range(WIDTH)]
    Task.objects.bulk_create(
        [Task(dag=dag, task_id=name, upstream=["root"], position=i + 1, **noop) for i, name in enumerate(middle)]
    )
    Task.objects.create(dag=dag, task_id="sink", upstream=middle, position=WIDTH + 1, **noop)
    run = trigger(dag)
    timings = {"ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.5", "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "2", "ORCHESTRATOR_WORKER_CONCURRENCY": "8"}
    worker(**timings)
    worker(**timings)
    settle_runs([run], timeout=600)
    contexts = list(TaskAttempt.objects.filter(task_instance__dag_run=run, state="failed").values_list("context", flat=True))
    assert not PRESUMED_LOST & {context["reason"] for context in contexts}, contexts[:5]
    assert run.state == "success"
    assert TaskAttempt.objects.filter(task_instance__dag_run=run).count() == WIDTH + 2
