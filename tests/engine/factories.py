"""factory-boy factories for DAGs, tasks and runs."""
from __future__ import annotations

import factory
from django.utils import timezone

from orchestrator.models import Dag, Task


class DagFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Dag

    dag_id = factory.Sequence(lambda n: f"dag_{n}")
    default_args = factory.LazyFunction(lambda: {"retry_delay": 0.1})


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    dag = factory.SubFactory(DagFactory)
    task_id = factory.Sequence(lambda n: f"task_{n}")
    bash_command = "true"
    position = factory.Sequence(lambda n: n)


def diamond(dag_id: str = "diamond", **default_args) -> Dag:
    """a -> (b, c) -> d"""
    dag = DagFactory(dag_id=dag_id, default_args={"retry_delay": 0.1, **default_args})
    TaskFactory(dag=dag, task_id="a")
    TaskFactory(dag=dag, task_id="b", upstream=["a"])
    TaskFactory(dag=dag, task_id="c", upstream=["a"])
    TaskFactory(dag=dag, task_id="d", upstream=["b", "c"])
    return dag


def now():
    return timezone.now()
