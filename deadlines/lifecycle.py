"""Where the engine tells the deadlines app that a run or task reached a reference point.

Each function runs inside the engine's transaction, so a deadline exists exactly when the
state change that created it does. Need-by times are computed once, here, and stored: the
periodic check only compares them with the clock.
"""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from deadlines import references
from deadlines.conf import int_setting
from deadlines.models import (
    DAG_REFERENCES,
    OPEN_STATES,
    Deadline,
    DeadlineDefinition,
    Reference,
)
from deadlines.resolution import settle_finished
from orchestrator.data import sql
from orchestrator.models import DagRun, TaskInstance
from retries.states import RunState

log = logging.getLogger(__name__)


def run_created(dag_run: DagRun, now: datetime) -> None:
    """A run was queued: create its DAG-level deadlines."""
    definitions = [
        d
        for d in _dag_level_definitions(dag_run.dag_id)
        if d.reference in DAG_REFERENCES
        # A backfill's run gets only the deadlines measured from its own queue time: one
        # from its logical date (long past) or a fixed time would be missed at once.
        and (dag_run.backfill_id is None or d.reference == Reference.DAGRUN_QUEUED_AT)
    ]
    if not definitions:
        return
    facts = references.Facts(
        now=now,
        tz=_timezone(dag_run),
        queued_at=dag_run.queued_at,
        logical_date=dag_run.logical_date,
        recent_run_durations=_recent_run_durations(dag_run)
        if any(d.reference == Reference.AVERAGE_RUNTIME for d in definitions)
        else (),
    )
    _create(dag_run, None, definitions, facts)


def _dag_level_definitions(dag_id: int) -> list[DeadlineDefinition]:
    """The DAG's own deadline definitions (not a task's), in their order. Written SQL: every
    trigger reads them, and the model's ordering would join the DAG and the task tables."""
    fields = sql.concrete_fields(DeadlineDefinition)
    rows = sql.fetch(
        f"SELECT {sql.columns('d', fields)} FROM {DeadlineDefinition._meta.db_table} d"
        " WHERE d.dag_id = %s AND d.task_id IS NULL ORDER BY d.position, d.id",
        [dag_id],
        fields,
    )
    build = sql.builder(DeadlineDefinition, fields)
    return [build(row) for row in rows]


def task_queued(task_instance: TaskInstance, now: datetime) -> None:
    """A task was dispatched: create its task_queued_at deadlines (first dispatch only)."""
    _create_task_deadlines(task_instance, Reference.TASK_QUEUED_AT, now)


def queued_deadlines_exist_sql(task_instance: str) -> tuple[str, list[Any]]:
    """An SQL expression (with its parameters): whether the task instance aliased
    `task_instance` has task_queued_at deadline definitions, for a dispatch to return with the
    rows it moved (then `task_queued` is called only for those)."""
    return (
        f"EXISTS (SELECT 1 FROM deadlines_deadlinedefinition qd WHERE qd.task_id = {task_instance}.definition_id AND qd.reference = %s)",
        [str(Reference.TASK_QUEUED_AT)],
    )


def task_started(task_instance: TaskInstance, now: datetime) -> None:
    """A task reported running: create its task_started_at deadlines (first start only)."""
    _create_task_deadlines(task_instance, Reference.TASK_STARTED_AT, now)


def start_deadlines_exist_sql(task_instance: str) -> tuple[str, list[Any]]:
    """An SQL expression (with its parameters): whether the task instance aliased
    `task_instance` has task_started_at deadline definitions, for a claim to read with the rest."""
    return (
        f"EXISTS (SELECT 1 FROM deadlines_deadlinedefinition sd WHERE sd.task_id = {task_instance}.definition_id AND sd.reference = %s)",
        [str(Reference.TASK_STARTED_AT)],
    )


def has_start_deadlines(task_instance_id: int) -> bool:
    """Whether the task has task_started_at deadline definitions (one query, for the worker's
    hot path: most tasks have none, and then nothing else is read)."""
    exists, params = start_deadlines_exist_sql("ti")
    rows = sql.fetch(f"SELECT {exists} FROM orchestrator_taskinstance ti WHERE ti.id = %s", [*params, task_instance_id], [None])
    return bool(rows and rows[0][0])


def task_started_by_id(task_instance_id: int, now: datetime) -> None:
    """`task_started` for a task instance known by its id."""
    ti = TaskInstance.objects.select_related("dag_run__dag").get(pk=task_instance_id)
    _create_task_deadlines(ti, Reference.TASK_STARTED_AT, now)


def task_finished(task_instance: TaskInstance | int, now: datetime) -> None:
    """A task reached a final state: resolve its task-level deadlines."""
    pk = task_instance if isinstance(task_instance, int) else task_instance.pk
    rows = list(Deadline.objects.select_related("dag_run__dag").filter(task_instance_id=pk))
    if rows:
        settle_finished(rows, now)


def tasks_finished(task_instance_ids: list[int], now: datetime) -> None:
    """`task_finished` for many tasks at once (an operator's action on a mapped task's instances):
    one read of their deadlines."""
    rows = list(Deadline.objects.select_related("dag_run__dag").filter(task_instance_id__in=task_instance_ids))
    if rows:
        settle_finished(rows, now)


def run_finished(dag_run: DagRun, now: datetime) -> None:
    """A run reached success or failed: resolve its DAG-level deadlines."""
    finished_at = now
    rows = list(Deadline.objects.select_related("dag_run__dag").filter(dag_run_id=dag_run.pk))
    settle_finished([d for d in rows if d.task_instance_id is None], finished_at)
    # A task deadline still open here belongs to a task the engine never finished (say, one
    # removed mid-run): the run's end is the last moment it could have been met.
    settle_finished([d for d in rows if d.task_instance_id is not None and d.state in OPEN_STATES], finished_at, final_lateness=False)


# --- helpers ---------------------------------------------------------------------------------


def _create_task_deadlines(
    ti: TaskInstance, reference: Reference, now: datetime, definitions: list[DeadlineDefinition] | None = None
) -> None:
    if ti.definition_id is None:
        return
    if definitions is None:
        definitions = list(DeadlineDefinition.objects.filter(task_id=ti.definition_id, reference=reference))
    if not definitions:
        return
    # First dispatch (or start) only: a retry does not restart the clock.
    seen = set(
        Deadline.objects.filter(task_instance_id=ti.pk, reference=reference).values_list("definition_id", flat=True)
    )
    definitions = [d for d in definitions if d.pk not in seen]
    if not definitions:
        return
    run = ti.dag_run
    facts = references.Facts(
        now=now,
        tz=_timezone(run),
        queued_at=run.queued_at,
        logical_date=run.logical_date,
        task_queued_at=now if reference == Reference.TASK_QUEUED_AT else ti.queued_at,
        task_started_at=now if reference == Reference.TASK_STARTED_AT else ti.start_date,
    )
    _create(run, ti, definitions, facts)


def _create(run: DagRun, ti: TaskInstance | None, definitions: list[DeadlineDefinition], facts: references.Facts) -> None:
    rows = []
    for definition in definitions:
        try:
            if not references.applies_on(run.logical_date, facts.tz, definition.days or (), definition.skip_dates or ()):
                continue
            need_by = references.resolve(
                definition.reference,
                definition.interval,
                facts,
                fixed=definition.datetime_text or definition.datetime,
                window=int_setting("ORCHESTRATOR_AVERAGE_RUNTIME_WINDOW"),
                min_runs=int_setting("ORCHESTRATOR_AVERAGE_RUNTIME_MIN_RUNS"),
            )
        except references.DefinitionError as exc:
            # A definition that got past validation but cannot be resolved must not stop the run.
            log.error("deadline definition %s of DAG %s skipped: %s", definition.pk, run.dag_id, exc)
            continue
        if need_by is None:
            continue
        rows.append(
            Deadline(
                definition=definition,
                dag_run=run,
                task_instance=ti,
                scope="task" if ti is not None else "dag",
                task_id=ti.task_id if ti is not None else None,
                reference=definition.reference,
                callback=definition.callback,
                callback_kwargs=definition.callback_kwargs or {},
                warn=definition.warn,
                need_by=need_by,
            )
        )
    if rows:
        Deadline.objects.bulk_create(rows)


def _timezone(run: DagRun) -> ZoneInfo:
    name = run.dag.timezone or "UTC"
    try:
        return ZoneInfo(name)
    except Exception:
        log.error("DAG %s has an unknown timezone %r; deadlines use UTC", run.dag.dag_id, name)
        return ZoneInfo("UTC")


def _recent_run_durations(run: DagRun) -> list[float]:
    """Seconds from start to end of the DAG's newest successful runs, newest first."""
    window = int_setting("ORCHESTRATOR_AVERAGE_RUNTIME_WINDOW")
    rows = (
        DagRun.objects.filter(dag_id=run.dag_id, state=RunState.SUCCESS, start_date__isnull=False, end_date__isnull=False)
        .exclude(pk=run.pk)
        .order_by("-end_date")
        .values_list("start_date", "end_date")[:window]
    )
    # The query leaves out rows without both dates; the test says so to the type checker.
    return [(end - start).total_seconds() for start, end in rows if start is not None and end is not None]
