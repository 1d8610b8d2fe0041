"""The DAG list (each DAG with its last few runs) and the DAG page's table of tasks, a page at a time."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.core.paginator import Paginator
from django.db.models import Exists, F, OuterRef, Window
from django.db.models.functions import RowNumber

from orchestrator.console.paging import Span
from orchestrator.data.taskconfig import merge_args
from orchestrator.models import Dag, DagRun, TaskInstance
from orchestrator.specs.budget import dag_verdicts
from retries.budget import Verdict
from retries.states import TaskState

RECENT_RUNS_PER_DAG = 5
TASKS_PER_PAGE = 100
TASK_FIELDS = ("dag", "task_id", "upstream", "trigger_rule", "python_callable", "bash_command", "args")


@dataclass
class DagRow:
    dag: Dag
    recent_runs: list[DagRun] = field(default_factory=list)


def dag_rows(owner: str = "") -> list[DagRow]:
    """Every DAG (or every DAG `owner` owns) with its last few runs (newest first), in two queries."""
    dags = list(Dag.objects.filter(owner=owner).order_by("dag_id") if owner else Dag.objects.order_by("dag_id"))
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
    if owner:
        recent = recent.filter(dag_id__in=list(rows))
    for run in recent:
        run.dag = rows[run.dag_id].dag
        rows[run.dag_id].recent_runs.append(run)
    return list(rows.values())


def owners() -> list[str]:
    """The owners DAGs have, for the DAG list's filter."""
    return list(Dag.objects.exclude(owner="").order_by("owner").values_list("owner", flat=True).distinct())


@dataclass
class TaskRow:
    task_id: str
    upstream: list[str]
    trigger_rule: str
    command: str
    retries: int
    infrastructure_retry_limit: int
    queue: str


@dataclass
class TaskPage:
    """One page of the DAG's task definitions, in DAG order, with where it sits among them all."""

    rows: list[TaskRow]
    span: Span
    verdicts: list[Verdict]  # the retry budgets of the page's tasks against their deadlines


def task_page(dag: Dag, page: int) -> TaskPage:
    """Page `page` (clamped) of TASKS_PER_PAGE task definitions: a 10,000-task DAG is read a
    hundred at a time, its count and its page in two queries, its deadlines in a third."""
    paginator = Paginator(dag.tasks.order_by("position", "id").only(*TASK_FIELDS), TASKS_PER_PAGE, allow_empty_first_page=True)
    shown = paginator.get_page(page)
    rows = []
    for task in shown.object_list:
        args = merge_args(dag.default_args, task.args)
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
    return TaskPage(
        rows=rows,
        span=Span.of(shown.number, TASKS_PER_PAGE, paginator.count, len(rows)),
        verdicts=dag_verdicts(dag, [(t.pk, t.task_id, t.args) for t in shown.object_list]),
    )
