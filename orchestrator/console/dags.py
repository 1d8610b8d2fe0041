"""The DAG list (each DAG with its last few runs) and the DAG page's table of tasks."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Exists, F, OuterRef, Window
from django.db.models.functions import RowNumber

from orchestrator.models import Dag, DagRun, TaskInstance
from orchestrator.taskconfig import effective_args
from retries.states import TaskState

RECENT_RUNS_PER_DAG = 5


@dataclass
class DagRow:
    dag: Dag
    recent_runs: list[DagRun] = field(default_factory=list)


def dag_rows() -> list[DagRow]:
    """Every DAG with its last few runs (newest first), in two queries."""
    dags = list(Dag.objects.order_by("dag_id"))
    rows = {dag.pk: DagRow(dag) for dag in dags}
    dead = TaskInstance.objects.filter(dag_run=OuterRef("pk"), state=TaskState.DEAD_LETTER)
    recent = (
        DagRun.objects.annotate(
            needs_attention=Exists(dead),
            position=Window(RowNumber(), partition_by=F("dag_id"), order_by=[F("queued_at").desc(), F("id").desc()])
        )
        .filter(position__lte=RECENT_RUNS_PER_DAG)
        .order_by("dag_id", "position")
    )
    for run in recent:
        run.dag = rows[run.dag_id].dag
        rows[run.dag_id].recent_runs.append(run)
    return list(rows.values())


@dataclass
class TaskRow:
    task_id: str
    upstream: list[str]
    trigger_rule: str
    command: str
    retries: int
    infrastructure_retry_limit: int
    queue: str


def task_rows(dag: Dag) -> list[TaskRow]:
    rows = []
    for task in dag.tasks.all():
        task.dag = dag
        args = effective_args(task)
        rows.append(
            TaskRow(
                task_id=task.task_id,
                upstream=list(task.upstream),
                trigger_rule=task.trigger_rule,
                command=task.python_callable or task.bash_command,
                retries=int(args["retries"]),
                infrastructure_retry_limit=int(args["infrastructure_retry_limit"]),
                queue=str(args["queue"]),
            )
        )
    return rows
