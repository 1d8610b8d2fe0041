"""The DAG page's grid: the last runs (columns, oldest first) × the DAG's tasks (rows).

A page of TASKS_PER_PAGE tasks at a time (`?grid_page=N`): a 10,000-task DAG is 100 pages of
100, not 250,000 cells. Three or four queries whatever the history and the DAG's size: the runs, the
page's tasks (with the tasks no longer in the DAG that the runs still have, and the count of
them all), the page's task instances (only the columns a cell needs), and when the page has a
mapped task, its instances counted by state in the database, never read one by one. Links are built from one reversed
prefix per run, since reversing thousands of URLs would cost more than the rest of the page.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import quote

from django.db.models import Count, Sum
from django.urls import reverse
from django.utils import timezone

from orchestrator.console.mapped import counts_text, worst_state
from orchestrator.console.paging import Span
from orchestrator.console.text import attempt_label, duration, seconds_between
from orchestrator.data import sql
from orchestrator.models import Dag, DagRun, TaskInstance
from retries.states import UNFINISHED_RUN_STATES, TaskState

RECENT_RUNS = 25
TASKS_PER_PAGE = 100


class Instance(NamedTuple):
    """What a cell shows of a task instance (a run's task instances may carry large contexts):
    read as plain rows, a page of them costs no model objects."""

    dag_run_id: int
    task_id: str
    map_index: int
    state: str
    try_number: int
    max_tries: int
    infrastructure_try_number: int
    waiting_for: Any


CELL_FIELDS = Instance._fields


# The grid's legend: every task state a square can take, in the order a run goes through them.
LEGEND = [
    (TaskState.NONE, "not started"),
    (TaskState.SCHEDULED, "scheduled"),
    (TaskState.QUEUED, "queued"),
    (TaskState.RUNNING, "running"),
    (TaskState.SUCCESS, "success"),
    (TaskState.UP_FOR_RETRY, "up for retry"),
    (TaskState.UP_FOR_RESCHEDULE, "waiting (a wait, an event, an approval)"),
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

    @property
    def instances_label(self) -> str:
        """The count as the 14 px square can hold it: up to three characters ("450", "1k",
        "12k"); the title has the exact counts."""
        return str(self.instances) if self.instances < 1000 else f"{self.instances // 1000}k"


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
    task_ids: list[str]  # the page's
    runs: list[GridRun]  # oldest first, as a timeline reads
    active: bool
    span: Span  # the page's tasks among them all

    @property
    def legend(self) -> list[tuple[str, str]]:
        return [(state.value, words) for state, words in LEGEND]

    @property
    def rows(self) -> list[tuple[str, list[Cell | None]]]:
        return [(task_id, [run.cells[i] for run in self.runs]) for i, task_id in enumerate(self.task_ids)]


def waiting_words(waiting: Any, state: str) -> str:
    """What a task waits for, as the run and task pages say it: a `queued` task waits in a queue
    only when no live worker reads it (a `scheduled` one, when its queue is paused)."""
    if isinstance(waiting, dict) and waiting.get("kind") == "queue" and state == TaskState.QUEUED:
        return f"no worker listens on queue '{waiting.get('name', '')}'"
    text = waiting_text(waiting)
    return f"waiting for {text}" if text else ""


def waiting_text(waiting: Any) -> str:
    """`TaskInstance.waiting_for` as words: 'pool default', 'circuit warehouse'."""
    if not isinstance(waiting, dict) or not waiting.get("kind"):
        return ""
    if waiting["kind"] == "wait":  # up_for_reschedule: what it waits for, and its next check
        until = f", next check {waiting['next_check_at']}" if waiting.get("next_check_at") else ""
        return f"{str(waiting.get('name', '')).replace('_', ' ')}{until}"
    return f"{str(waiting['kind']).replace('_', ' ')} {waiting.get('name', '')}".strip()


def run_seconds(run: DagRun, now: datetime) -> float | None:
    start = run.start_date or run.queued_at
    return seconds_between(start, run.end_date or (now if run.state in UNFINISHED_RUN_STATES else None))


def build(dag: Dag, *, limit: int = RECENT_RUNS, now: datetime | None = None, page: int = 1) -> Grid:
    now = now or timezone.now()
    runs = list(DagRun.objects.filter(dag=dag).order_by("-queued_at", "-id")[:limit])[::-1]
    run_pks = [r.pk for r in runs]
    task_ids, total, page = _page_of_tasks(dag, run_pks, page)
    by_run = _cells_by_run(run_pks, task_ids)
    seconds = [run_seconds(run, now) for run in runs]
    longest = max((s for s in seconds if s), default=0.0)
    grid_runs = []
    for run, secs in zip(runs, seconds):
        run.dag = dag
        url = reverse("web:run_detail", args=[dag.dag_id, run.run_id])
        found = by_run.get(run.pk, {})
        cells = [_cell(found.get(task_id), url) for task_id in task_ids]
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
    return Grid(task_ids=task_ids, runs=grid_runs, active=any(r.state in UNFINISHED_RUN_STATES for r in runs),
                span=Span.of(page, TASKS_PER_PAGE, total, len(task_ids)))


def _page_of_tasks(dag: Dag, run_pks: list[int], page: int) -> tuple[list[str], int, int]:
    """The task ids of grid page `page` (clamped), the number of rows in all and the page, in one query: the DAG's tasks in order, then those removed from it since
    that the runs shown still have."""
    rows = _task_rows(dag, run_pks, page)
    if not rows and page > 1:  # past the last page (a stale link): show the first
        page, rows = 1, _task_rows(dag, run_pks, 1)
    total = rows[0][1] if rows else 0
    return [task_id for task_id, _ in rows], total, page


def _task_rows(dag: Dag, run_pks: list[int], page: int) -> list[tuple]:
    removed, params = "", [dag.pk]
    if run_pks:
        removed = (
            # A removed task's instances lost their definition (set null): only those are read.
            " UNION ALL SELECT DISTINCT ti.task_id, 1, 0, 0 FROM orchestrator_taskinstance ti"
            f" WHERE ti.dag_run_id IN ({sql.placeholders(len(run_pks))}) AND ti.definition_id IS NULL"
            " AND ti.task_id NOT IN (SELECT task_id FROM orchestrator_task WHERE dag_id = %s)"
        )
        params += [*run_pks, dag.pk]
    return sql.fetch(
        "SELECT task_id, COUNT(*) OVER () FROM ("
        " SELECT task_id, 0 AS gone, position, id FROM orchestrator_task WHERE dag_id = %s"
        f"{removed}) AS grid_rows ORDER BY gone, position, id, task_id LIMIT %s OFFSET %s",
        [*params, TASKS_PER_PAGE, (page - 1) * TASKS_PER_PAGE],
        [None, None],
    )


@dataclass
class MappedCounts:
    """A mapped task's instances in one run: how many in each state, platform retries summed."""

    task_id: str
    counts: dict[str, int] = field(default_factory=dict)
    platform_retries: int = 0


def _cells_by_run(run_pks: list[int], task_ids: list[str]) -> dict[int, dict[str, Instance | MappedCounts]]:
    """What each run's cell of each task shows: its instance, or a mapped task's counts."""
    found: dict[int, dict[str, Instance | MappedCounts]] = {}
    if not run_pks or not task_ids:
        return found
    shown = TaskInstance.objects.filter(dag_run_id__in=run_pks, task_id__in=task_ids)
    # A task not mapped (or not expanded yet) has one instance, map_index -1; a mapped task's
    # instance 0 says it has more, counted next. (Below -1: the former instances of a task made
    # unexpanded again, no cells of their own.)
    expanded = False
    for ti in map(Instance._make, shown.filter(map_index__gte=-1, map_index__lte=0).values_list(*CELL_FIELDS).order_by()):
        if ti.map_index == 0:
            expanded = True
        else:
            found.setdefault(ti.dag_run_id, {})[ti.task_id] = ti
    if not expanded:
        return found
    counted = (
        shown.filter(map_index__gte=0).values_list("dag_run_id", "task_id", "state")
        .annotate(n=Count("id"), platform=Sum("infrastructure_try_number")).order_by()
    )
    for run_pk, task_id, state, n, platform in counted:
        cells = found.setdefault(run_pk, {})
        mapped = cells.get(task_id)
        if isinstance(mapped, Instance) and state == TaskState.REMOVED:
            continue  # expanded over an empty list: the skipped task's cell, not its removed instances
        if not isinstance(mapped, MappedCounts):
            mapped = cells[task_id] = MappedCounts(task_id)
        mapped.counts[state] = n
        mapped.platform_retries += platform or 0
    return found


def _cell(found: Instance | MappedCounts | None, run_url: str) -> Cell | None:
    if found is None:
        return None
    if isinstance(found, MappedCounts):
        return _mapped_cell(found, run_url)
    ti = found
    waiting = waiting_text(ti.waiting_for)
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


def _mapped_cell(mapped: MappedCounts, run_url: str) -> Cell:
    """One cell for a mapped task's instances: coloured by the worst state, counts in its title."""
    return Cell(
        state=worst_state(mapped.counts),
        url=f"{run_url}tasks/{quote(mapped.task_id)}",
        title=f"{mapped.task_id}: {counts_text(mapped.counts)}",
        platform_retries=mapped.platform_retries,
        waiting="",
        instances=sum(mapped.counts.values()),
    )
