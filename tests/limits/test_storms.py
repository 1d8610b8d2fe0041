"""An infrastructure storm pauses its queue: held, not charged, released when it ages out."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.engine import storms
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_run
from orchestrator.models import Dag, DagRun, Task, TaskAttempt, TaskInstance
from retries.storms import paused


@given(counts=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 50)), threshold=st.integers(0, 50))
def test_the_rule_pauses_exactly_the_queues_at_or_over_the_threshold(counts, threshold):
    result = paused(counts, threshold)
    if threshold == 0:
        assert result == set()
    else:
        assert result == {q for q, n in counts.items() if n >= threshold}


def _failed_attempts(queue: str, reason: str, count: int, ended_ago: float) -> None:
    dag = Dag.objects.create(dag_id=f"storm-{queue}-{reason}-{ended_ago}", max_active_runs=100)
    task = Task.objects.create(dag=dag, task_id="t", python_callable="tests.worker.tasks.succeed", args={"queue": queue})
    now = timezone.now()
    for i in range(count):
        run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now - timedelta(minutes=i + 1), now=now)
        ti = TaskInstance.objects.get(dag_run=run, definition=task)
        TaskAttempt.objects.create(
            task_instance=ti, attempt_token=1, try_number=1, infrastructure_try_number=0, kind="platform", state="failed",
            queued_at=now, end_date=now - timedelta(seconds=ended_ago), context={"category": "infrastructure", "reason": reason},
        )


@pytest.mark.django_db
def test_a_storm_of_lost_workers_pauses_only_its_queue_and_holds_its_tasks(settings):
    settings.ORCHESTRATOR_QUEUE_STORM_THRESHOLD = 3
    settings.ORCHESTRATOR_QUEUE_STORM_WINDOW = 60
    storms.forget()
    _failed_attempts("gpu", "worker_lost", 3, ended_ago=5)
    _failed_attempts("default", "task_exception", 10, ended_ago=5)  # the task's own failures: no storm
    _failed_attempts("cpu", "pre_execution_failure", 3, ended_ago=120)  # aged out of the window
    assert storms.paused_queues(timezone.now()) == {"gpu"}

    dag = Dag.objects.create(dag_id="held", max_active_runs=100)
    Task.objects.create(dag=dag, task_id="g", python_callable="tests.worker.tasks.succeed", args={"queue": "gpu"})
    Task.objects.create(dag=dag, task_id="d", python_callable="tests.worker.tasks.succeed", args={"queue": "default"})
    run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=timezone.now(), now=timezone.now())
    advance_run(run.pk)
    held = TaskInstance.objects.get(dag_run=run, task_id="g")
    assert (held.state, held.try_number) == ("scheduled", 0)
    assert held.waiting_for["kind"] == "queue"
    assert held.waiting_for["name"] == "gpu"
    assert TaskInstance.objects.get(dag_run=run, task_id="d").state == "queued"

    settings.ORCHESTRATOR_QUEUE_STORM_THRESHOLD = 0  # off: nothing is paused
    storms.forget()
    assert storms.paused_queues(timezone.now()) == set()
