"""Factories for DAGs with deadlines (DAGs and tasks come from the engine's factories)."""
from __future__ import annotations

from datetime import timedelta

import factory
from django.utils import timezone

from deadlines.models import DeadlineDefinition
from orchestrator.models import Dag, DagRun, TaskAttempt, TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

__all__ = ["DagFactory", "TaskFactory", "DeadlineDefinitionFactory", "add_history", "chain_dag"]


class DeadlineDefinitionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DeadlineDefinition

    dag = factory.SubFactory(DagFactory)
    reference = "dagrun_queued_at"
    interval = 60.0
    callback = "notifier:log"
    position = factory.Sequence(lambda n: n)


def chain_dag(dag_id: str, task_ids: tuple[str, ...] = ("a",), *, python_callable: str = "", bash_command: str = "true", **dag_fields) -> Dag:
    """A DAG whose tasks run one after another, in the order given."""
    dag = DagFactory(dag_id=dag_id, **dag_fields)
    previous: list[str] = []
    for task_id in task_ids:
        TaskFactory(
            dag=dag,
            task_id=task_id,
            upstream=previous,
            python_callable=python_callable,
            bash_command="" if python_callable else bash_command,
        )
        previous = [task_id]
    return dag


def add_history(dag: Dag, typical: dict[str, float], runs: int = 3) -> None:
    """Past successful runs whose attempts of each task took `typical[task_id]` seconds."""
    base = timezone.now() - timedelta(days=1)
    for i in range(runs):
        start = base + timedelta(hours=i)
        run = DagRun.objects.create(dag=dag, run_id=f"past{i}", state="success", logical_date=start, queued_at=start,
                                    start_date=start, end_date=start + timedelta(minutes=5))
        for task_id, seconds in typical.items():
            ti = TaskInstance.objects.create(dag_run=run, task_id=task_id, definition=dag.tasks.get(task_id=task_id),
                                             state="success", start_date=start, end_date=start + timedelta(seconds=seconds))
            TaskAttempt.objects.create(task_instance=ti, attempt_token=1, try_number=1, infrastructure_try_number=0,
                                       state="success", queued_at=start, start_date=start, end_date=start + timedelta(seconds=seconds))
