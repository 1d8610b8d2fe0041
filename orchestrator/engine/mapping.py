"""Mapped tasks: a task with `expand: {NAME: SOURCE}` becomes one task instance per item of its
source when its upstreams let it run.

`expand_ready()` is called by `advance_run()` (in its transaction, with the run locked on
PostgreSQL) for a mapped task's first instance (map_index -1) the moment its trigger rule says
it may run. The expansion is fenced like every state change: the -1 row moves from `none` (with
the attempt token it was read with) to become instance 0, and only the caller that won that move
inserts instances 1..n-1, in one INSERT; the unique (run, task, map_index) constraint backs it
up. So two schedulers, or a scheduler and a worker's report, never expand a task twice.

An instance is a task instance like any other: its own tries, budgets, attempts, deadlines,
result and actions; the state machine does not know it was mapped.

A task made unexpanded again (its source cleared with it, `clearing.unexpand`) has its
placeholder (its former instance 0) and its other former instances parked below -1. Its next
expansion moves the placeholder to instance 0 as always, places each parked row back at its
map_index k (over new item k, or `removed` past the new list) and inserts only the indexes the
old list did not have: every instance keeps its row, and so its attempts, across expansions.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from deadlines import lifecycle
from orchestrator.data import metrics, sql
from orchestrator.engine import tablestats
from orchestrator.engine.clearing import parked_index
from orchestrator.engine.transitions import transition
from orchestrator.engine.upstream import upstream_results
from orchestrator.listeners import notify
from orchestrator.models import TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState

log = logging.getLogger(__name__)

RESULTS_PREFIX = "results."


def expand_source(expand: Mapping[str, Any]) -> tuple[str, Any]:
    """(NAME, SOURCE) of a task's `expand` (validated: exactly one name)."""
    ((name, source),) = expand.items()
    return name, source


def source_task(source: Any) -> str | None:
    """The upstream a `results.TASK_ID` source reads; None for a literal list."""
    return source[len(RESULTS_PREFIX) :] if isinstance(source, str) and source.startswith(RESULTS_PREFIX) else None


# --- the rule (pure) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Expansion:
    """What a mapped task's source gives: its items, or why it cannot expand."""

    items: list[Any] | None = None
    problem: dict[str, Any] | None = None  # the invalid_expand failure's metadata


def expansion_of(source: Any, value: Any, max_length: int) -> Expansion:
    """`value` is the source's list (a literal, or the upstream's result as read)."""
    where = source if isinstance(source, str) else "a list literal"
    if not isinstance(value, list):
        return Expansion(problem={
            "expand_source": where,
            "got_type": "null" if value is None else type(value).__name__,
            "got": _preview(value),
            "detail": f"{where} is not a list but {'null' if value is None else type(value).__name__}",
        })
    if len(value) > max_length:
        return Expansion(problem={
            "expand_source": where,
            "got_type": "list",
            "length": len(value),
            "max_length": max_length,
            "detail": f"{where} has {len(value)} items, over ORCHESTRATOR_MAX_MAP_LENGTH={max_length}",
        })
    return Expansion(items=list(value))


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


# --- in advance_run's transaction --------------------------------------------------------------


def is_unexpanded(ti: TaskInstance) -> bool:
    """A mapped task's placeholder, waiting to expand."""
    return ti.map_index < 0 and ti.definition is not None and bool(ti.definition.expand)


def expand_ready(ti: TaskInstance, now: datetime) -> tuple[TaskState, list[TaskInstance]] | None:
    """Expand a mapped task whose upstreams let it run.

    Returns the placeholder's new state and the instances to dispatch (the placeholder itself,
    now instance 0, first); None when another process expanded it first (nothing changed here).
    An empty source skips the task; a bad one fails it at once as application/invalid_expand.
    """
    assert ti.definition is not None
    assert ti.definition.expand
    _, source = expand_source(ti.definition.expand)
    upstream = source_task(source)
    value = upstream_results(ti.dag_run_id, [upstream])[upstream] if upstream else source
    expansion = expansion_of(source, value, int(settings.ORCHESTRATOR_MAX_MAP_LENGTH))
    if expansion.problem is not None:
        return _fail(ti, expansion.problem, now)
    items = expansion.items or []
    if not items:
        with transaction.atomic():
            if not transition(ti.pk, expected=[TaskState.NONE], token=ti.attempt_token, state=TaskState.SKIPPED, end_date=now):
                return None
            _place_parked(ti, items)
        ti.state = TaskState.SKIPPED
        lifecycle.task_finished(ti, now)
        return TaskState.SKIPPED, []
    with transaction.atomic():  # a savepoint: the move and the INSERT stand or fall together
        if not transition(
            ti.pk, expected=[TaskState.NONE], token=ti.attempt_token,
            state=TaskState.SCHEDULED, map_index=0, map_item=items[0],
        ):
            return None
        ti.state, ti.map_index, ti.map_item = TaskState.SCHEDULED, 0, items[0]
        placed = _place_parked(ti, items)
        _insert(ti, items[placed:], start=placed)
        created = list(
            TaskInstance.objects.filter(dag_run_id=ti.dag_run_id, task_id=ti.task_id, map_index__gte=1, map_index__lt=len(items))
            .order_by("map_index")
        ) if len(items) > 1 else []
    log.info("task %s of run %s expanded into %d instances", ti.task_id, ti.dag_run_id, len(items))
    return TaskState.SCHEDULED, [ti, *created]


def _place_parked(first: TaskInstance, items: list[Any]) -> int:
    """Place the instances of an earlier expansion, parked while the task was unexpanded
    (`clearing.unexpand`), back at their map_index k: `scheduled` over new item k, or, past the
    new list, `removed` (their rows, and so their attempts, kept). Returns the first map_index
    (1 and up) that has no row yet."""
    parked = list(
        TaskInstance.objects.filter(dag_run_id=first.dag_run_id, task_id=first.task_id, map_index__lt=-1).values_list("pk", "map_index")
    )
    if not parked:
        return 1
    item_field = TaskInstance._meta.get_field("map_item")
    updated_at = TaskInstance._meta.get_field("updated_at").get_db_prep_save(timezone.now(), connection)
    table, removed = TaskInstance._meta.db_table, str(TaskState.REMOVED)
    running, past = [], []
    for pk, parked_at in parked:
        index = parked_index(parked_at)
        if index < len(items):
            running.append([index, item_field.get_db_prep_save(items[index], connection), str(TaskState.SCHEDULED), updated_at, pk, parked_at])
        else:
            past.append([index, updated_at, pk, parked_at])
    where = f"WHERE id = %s AND map_index = %s AND state = '{removed}'"
    with connection.cursor() as cursor:
        if running:
            cursor.executemany(f"UPDATE {table} SET map_index = %s, map_item = %s, state = %s, updated_at = %s {where}", running)
        if past:
            cursor.executemany(f"UPDATE {table} SET map_index = %s, updated_at = %s {where}", past)
    return max(parked_index(parked_at) for _, parked_at in parked) + 1


def _insert(first: TaskInstance, items: list[Any], start: int = 1) -> None:
    """Insert instances start..start+len(items)-1 of a mapped task (`first` is instance 0).

    `bulk_create` builds a model object and prepares every column of every row (7 s of a
    10,000-instance expansion under load), and on SQLite, which binds at most 999 parameters a
    statement, writes some 24 rows an INSERT, each with RETURNING. Here the columns are prepared
    once, each row sets only its map_index and item (SQLite: one prepared INSERT run for every row; PostgreSQL: a few multi-row INSERTs), and
    one SELECT reads the rows back."""
    if not items:
        return
    fields = [field for field in sql.concrete_fields(TaskInstance) if not field.primary_key]
    template = _instance(first, start, None)
    base = [field.get_db_prep_save(field.pre_save(template, True), connection) for field in fields]
    names = [field.name for field in fields]
    index_at, item_at = names.index("map_index"), names.index("map_item")
    item_field = TaskInstance._meta.get_field("map_item")

    def row(map_index: int, item: Any) -> list[Any]:
        values = base.copy()
        values[index_at], values[item_at] = map_index, item_field.get_db_prep_save(item, connection)
        return values

    quote = connection.ops.quote_name
    insert = f"INSERT INTO {quote(TaskInstance._meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) VALUES "
    one = f"({sql.placeholders(len(fields))})"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One statement with two arrays: the server would spend seconds parsing and planning
            # thousands of rows of parameters.
            columns = [
                "u.map_index" if at == index_at else "u.map_item::jsonb" if at == item_at else "%s" for at in range(len(fields))
            ]
            constants = [value for at, value in enumerate(base) if at not in (index_at, item_at)]
            cursor.execute(
                f"{insert.removesuffix(' VALUES ')} SELECT {', '.join(columns)}"
                " FROM unnest(%s::integer[], %s::text[]) AS u(map_index, map_item)",
                [*constants, list(range(start, start + len(items))), [json.dumps(item, cls=item_field.encoder) for item in items]],
            )
        else:  # SQLite, in the process: a prepared statement run for every row costs next to nothing
            cursor.executemany(insert + one, [row(map_index, item) for map_index, item in enumerate(items, start=start)])
    tablestats.grew(TaskInstance._meta.db_table, len(items))


def _instance(first: TaskInstance, map_index: int, item: Any) -> TaskInstance:
    """Instance `map_index`, ready to run, with the settings its run gave the placeholder."""
    return TaskInstance(
        dag_run_id=first.dag_run_id,
        definition_id=first.definition_id,
        task_id=first.task_id,
        map_index=map_index,
        map_item=item,
        state=TaskState.SCHEDULED,
        # A fresh set of tries: instance 0 may have run before (an expansion over a new list).
        max_tries=first.max_tries - first.try_number,
        infrastructure_retry_limit=first.infrastructure_retry_limit,
        queue=first.queue,
        pool=first.pool,
        pool_slots=first.pool_slots,
        priority_weight=first.priority_weight,
        circuit=first.circuit,
    )


def _fail(ti: TaskInstance, problem: dict[str, Any], now: datetime) -> tuple[TaskState, list[TaskInstance]] | None:
    """A source that is not a list or too long: failed at once, charged to the task (no retry
    could change what its upstream returned)."""
    context = ExecutionContext.of(Reason.INVALID_EXPAND, Source.SCHEDULER, **problem)
    if not transition(
        ti.pk, expected=[TaskState.NONE], token=ti.attempt_token,
        state=TaskState.FAILED, end_date=now, last_failure_context={**context.to_dict(), "at": now.isoformat()},
    ):
        return None
    ti.state = TaskState.FAILED
    lifecycle.task_finished(ti, now)
    dag_id = ti.dag_run.dag.dag_id if ti.dag_run_id else ""
    log.warning("task %s of run %s cannot expand: %s", ti.task_id, ti.dag_run_id, problem["detail"])

    def after_commit() -> None:
        metrics.increment(metrics.TASK_FAILURES, dag_id=dag_id, task_id=ti.task_id,
                          category=context.category.value, reason=context.reason.value)
        notify("on_task_instance_failed", previous_state=TaskState.NONE, task_instance=ti,
               error=problem["detail"], execution_context=context)

    transaction.on_commit(after_commit)
    return TaskState.FAILED, []
