"""The DAG page's grid: the last runs (columns, oldest first) × the DAG's tasks (rows).

Three queries whatever the history: the runs, their task instances (only the columns a cell
needs) and the task definitions. Links are built from one reversed prefix per run, since
reversing 1,250 URLs would cost more than the rest of the page.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from django.urls import reverse
from django.utils import timezone

from orchestrator.console.mapped import counts_text, is_mapped, worst_state
from orchestrator.console.text import attempt_label, duration, seconds_between
from orchestrator.models import Dag, DagRun, TaskInstance
from retries.states import UNFINISHED_RUN_STATES, TaskState

RECENT_RUNS = 25
# Read only what a cell shows: a run's task instances may carry large contexts.
CELL_FIELDS = ["id", "dag_run_id", "task_id", "map_index", "state", "try_number", "max_tries", "infrastructure_try_number"]
HAS_WAITING_FOR = any(f.name == "waiting_for" for f in TaskInstance._meta.get_fields())


# The grid's legend: every task state a square can take, in the order a run goes through them.
LEGEND = [
    (TaskState.NONE, "not started"),
    (TaskState.SCHEDULED, "scheduled"),
    (TaskState.QUEUED, "queued"),
    (TaskState.RUNNING, "running"),
    (TaskState.SUCCESS, "success"),
    (TaskState.UP_FOR_RETRY, "up for retry"),
    (TaskState.FAILED, "failed"),
    (TaskState.UPSTREAM_FAILED, "upstream failed"),
    (TaskState.DEAD_LETTER, "dead letter"),
    (TaskState.SKIPPED, "skipped"),
    (TaskState.REMOVED, "removed"),
]


@dataclass(frozen=True)
class Cell:
    state: str
    url: str
    title: str
    platform_retries: int
    waiting: str  # '' or what the task waits for, e.g. "pool default"
    instances: int = 0  # a mapped task's number of instances (0: not mapped)


@dataclass
class GridRun:
    run: DagRun
    url: str
    seconds: float | None
    duration: str
    bar_percent: int
    needs_attention: bool
    cells: list[Cell | None] = field(default_factory=list)


@dataclass
class Grid:
    task_ids: list[str]
    runs: list[GridRun]  # oldest first, as a timeline reads
    active: bool

    @property
    def legend(self) -> list[tuple[str, str]]:
        return [(state.value, words) for state, words in LEGEND]

    @property
    def rows(self) -> list[tuple[str, list[Cell | None]]]:
        return [(task_id, [run.cells[i] for run in self.runs]) for i, task_id in enumerate(self.task_ids)]


def waiting_text(waiting: Any) -> str:
    """`TaskInstance.waiting_for` as words: 'pool default', 'circuit warehouse'."""
    if not isinstance(waiting, dict) or not waiting.get("kind"):
        return ""
    return f"{str(waiting['kind']).replace('_', ' ')} {waiting.get('name', '')}".strip()


def run_seconds(run: DagRun, now: datetime) -> float | None:
    start = run.start_date or run.queued_at
    return seconds_between(start, run.end_date or (now if run.state in UNFINISHED_RUN_STATES else None))


def build(dag: Dag, *, limit: int = RECENT_RUNS, now: datetime | None = None) -> Grid:
    now = now or timezone.now()
    runs = list(DagRun.objects.filter(dag=dag).order_by("-queued_at", "-id")[:limit])[::-1]
    task_ids = list(dag.tasks.order_by("position", "id").values_list("task_id", flat=True))
    fields = CELL_FIELDS + (["waiting_for"] if HAS_WAITING_FOR else [])
    instances = TaskInstance.objects.filter(dag_run_id__in=[r.pk for r in runs]).only(*fields)
    by_run: dict[int, dict[str, list[TaskInstance]]] = {}
    for ti in instances:
        by_run.setdefault(ti.dag_run_id, {}).setdefault(ti.task_id, []).append(ti)
        if ti.task_id not in task_ids:  # removed from the DAG since: still shown
            task_ids.append(ti.task_id)
    seconds = [run_seconds(run, now) for run in runs]
    longest = max((s for s in seconds if s), default=0.0)
    grid_runs = []
    for run, secs in zip(runs, seconds):
        run.dag = dag
        url = reverse("web:run_detail", args=[dag.dag_id, run.run_id])
        tis = by_run.get(run.pk, {})
        cells = [_cell(tis.get(task_id), url) for task_id in task_ids]
        grid_runs.append(
            GridRun(
                run=run,
                url=url,
                seconds=secs,
                duration=duration(secs) or "not started",
                bar_percent=max(2, round(100 * secs / longest)) if secs and longest else 0,
                needs_attention=any(c is not None and c.state == TaskState.DEAD_LETTER for c in cells),
                cells=cells,
            )
        )
    return Grid(task_ids=task_ids, runs=grid_runs, active=any(r.state in UNFINISHED_RUN_STATES for r in runs))


def _cell(tis: list[TaskInstance] | None, run_url: str) -> Cell | None:
    if not tis:
        return None
    if is_mapped(tis):
        return _mapped_cell(tis, run_url)
    ti = tis[0]
    waiting = waiting_text(getattr(ti, "waiting_for", None))
    title = f"{ti.task_id}: {ti.state}, {attempt_label(ti.try_number, ti.max_tries)}"
    if ti.infrastructure_try_number:
        title += f", {ti.infrastructure_try_number} platform retr{'y' if ti.infrastructure_try_number == 1 else 'ies'}"
    if waiting:
        title += f", waiting for {waiting}"
    return Cell(
        state=ti.state,
        url=f"{run_url}tasks/{quote(ti.task_id)}",
        title=title,
        platform_retries=ti.infrastructure_try_number,
        waiting=waiting,
    )


def _mapped_cell(tis: list[TaskInstance], run_url: str) -> Cell:
    """One cell for a mapped task's instances: coloured by the worst state, counts in its title."""
    states = [ti.state for ti in tis]
    platform = sum(ti.infrastructure_try_number for ti in tis)
    return Cell(
        state=worst_state(states),
        url=f"{run_url}tasks/{quote(tis[0].task_id)}",
        title=f"{tis[0].task_id}: {counts_text(states)}",
        platform_retries=platform,
        waiting="",
        instances=len(tis),
    )
