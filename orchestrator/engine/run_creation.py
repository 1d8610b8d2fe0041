"""Creating a run: the run row and one task instance per task, in one transaction.

`create_run` is what the scheduler, a backfill and a trigger share; `create_manual_run` is a
trigger's (an operator's, the API's), which checks what it is given and moves the run on at once.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo

from django.db import IntegrityError, connection, transaction

from deadlines import lifecycle
from orchestrator.data import sql
from orchestrator.data.taskconfig import merge_args
from orchestrator.engine import tablestats
from orchestrator.engine.admission import moved_in_place
from orchestrator.engine.limit_args import limit_args
from orchestrator.engine.run_advance import StartFailed, start_big_run, start_created_run
from orchestrator.engine.run_reads import instances_inserted
from orchestrator.exceptions import BadRequest
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.run_params import resolve_conf
from orchestrator.models import Backfill, Dag, DagRun, Task, TaskInstance
from retries.states import RunState

log = logging.getLogger(__name__)


def run_id_for(run_type: str, logical_date: datetime) -> str:
    return f"{run_type}__{logical_date.isoformat()}"


def create_run(
    dag: Dag,
    *,
    run_type: str,
    logical_date: datetime,
    conf: dict[str, Any] | None = None,
    now: datetime | None = None,
    triggered_by: str = "",
    backfill: Backfill | None = None,
    run_id: str | None = None,
) -> DagRun:
    """Insert the run and one task instance per task, in one transaction: a run is never seen
    with only some of its task instances. Its id is `run_id`, or made of its type and logical date."""
    now = now or shared_now()
    return _create_run(
        dag, run_type=run_type, logical_date=logical_date, conf=conf, now=now, triggered_by=triggered_by, backfill=backfill, run_id=run_id
    ).run


def _create_run(
    dag: Dag,
    *,
    run_type: str,
    logical_date: datetime,
    conf: dict[str, Any] | None,
    now: datetime,
    triggered_by: str,
    backfill: Backfill | None = None,
    run_id: str | None = None,
    read_back: bool = False,
) -> _Created:
    """`create_run`, with how many task instances the run has and, with `read_back` on
    PostgreSQL for a run too small to be analyzed first (`tablestats`), those instances as
    `instances_of` reads them, every column (None otherwise: read them when needed)."""
    # Inside a caller's transaction, no savepoint of its own: a caller that catches an
    # IntegrityError (a run id or logical date taken) takes its own.
    with transaction.atomic(savepoint=False):
        run = DagRun(
            dag=dag,
            run_id=run_id or run_id_for(run_type, logical_date),
            run_type=run_type,
            state=RunState.QUEUED,
            conf=conf or {},
            logical_date=logical_date,
            queued_at=now,
            triggered_by=triggered_by,
            backfill=backfill,
        )
        dag_read = _insert_run(run)
        tasks = dag_read.tasks
        read_back = read_back and connection.vendor == "postgresql" and not tablestats.analyzed_after_commit(len(tasks))
        instances = _insert_instances(run, tasks, read_back=read_back)
        if dag_read.has_run_deadlines:  # most DAGs have none: their definitions are not read
            lifecycle.run_created(run, now)
    return _Created(run, len(tasks), instances, dag_read.has_deadlines)


@dataclass(frozen=True)
class _Created:
    """A run just created: how many task instances it has, those instances when read back
    (`_create_run`), and whether its DAG has any deadline definition."""

    run: DagRun
    count: int
    instances: list[TaskInstance] | None
    has_deadlines: bool


# The DAG's tasks, in their order, with whether the DAG has deadlines of its own and any deadline
# (its own or its tasks'), joined to one row (on PostgreSQL the run just inserted, its id first):
# a DAG without tasks still answers it.
_TASKS = (
    "SELECT {run_id}t.id, t.task_id, t.args,"
    " EXISTS (SELECT 1 FROM deadlines_deadlinedefinition dd WHERE dd.dag_id = %s AND dd.task_id IS NULL),"
    " EXISTS (SELECT 1 FROM deadlines_deadlinedefinition dd WHERE dd.dag_id = %s)"
    " FROM {one} LEFT JOIN orchestrator_task t ON t.dag_id = %s ORDER BY t.position, t.id"
)


@dataclass(frozen=True)
class _DagRead:
    """What a run's creation reads of its DAG: its tasks (id, task_id, args), in order, and
    whether it has DAG-level deadline definitions, and any at all."""

    tasks: list[tuple[int, str, Any]]
    has_run_deadlines: bool
    has_deadlines: bool


def _insert_run(run: DagRun) -> _DagRead:
    """Insert `run` (its primary key set), and read its DAG's tasks and deadline definitions'
    presence (`_DagRead`): on PostgreSQL in one statement."""
    args_field = Task._meta.get_field("args")
    if connection.vendor == "postgresql":
        insert, params = sql.insert_statement(run)
        rows = sql.fetch(
            f"WITH one AS ({insert}) {_TASKS.format(run_id='one.id, ', one='one')}",
            [*params, run.dag_id, run.dag_id, run.dag_id],
            [None, None, None, args_field, None, None],
            prepare=True,  # the same text for every run: planned once per connection
        )
        sql.inserted(run, rows[0][0])
        rows = [row[1:] for row in rows]
    else:
        run.save(force_insert=True)
        rows = sql.fetch(
            _TASKS.format(run_id="", one="(SELECT 1) one"), [run.dag_id, run.dag_id, run.dag_id], [None, None, args_field, None, None]
        )
    return _DagRead([row[:3] for row in rows if row[0] is not None], bool(rows[0][3]), bool(rows[0][4]))


def _insert_instances(run: DagRun, tasks: list[tuple[int, str, Any]], *, read_back: bool = False) -> list[TaskInstance] | None:
    """One task instance (state none) for each of `tasks` (its DAG's, in order); with
    `read_back` (PostgreSQL), returns them as `instances_of` reads them.

    `bulk_create` builds a model object per row and prepares every column of every row: most of
    a 10,000-task trigger's creation. Here the columns that are the same for every instance are
    prepared once and each row adds only its own (its task and what its arguments say); on
    PostgreSQL one INSERT ... SELECT over one array per such column, on SQLite one prepared
    INSERT run for every row."""
    dag = run.dag
    varying: dict[str, list[Any]] = {
        name: []
        for name in (
            "definition", "task_id", "max_tries", "infrastructure_retry_limit", "queue", "pool", "pool_slots", "priority_weight", "circuit"
        )
    }
    for pk, task_id, task_args in tasks:
        args = merge_args(dag.default_args, task_args)
        limits = limit_args(task_args, dag.default_args)
        row = {
            "definition": pk,
            "task_id": task_id,
            "max_tries": int(args["retries"]) + 1,
            "infrastructure_retry_limit": int(args["infrastructure_retry_limit"]),
            "queue": str(args["queue"]),
            "pool": limits["pool"],
            "pool_slots": int(limits["pool_slots"]),
            "priority_weight": int(limits["priority_weight"]),
            "circuit": limits["circuit"],
        }
        for name, value in row.items():
            varying[name].append(value)
    if not varying["task_id"]:
        return [] if read_back else None
    fields = [field for field in sql.concrete_fields(TaskInstance) if not field.primary_key]
    template = TaskInstance(dag_run=run)
    constants = {
        field.name: field.get_db_prep_save(field.pre_save(template, True), connection) for field in fields if field.name not in varying
    }
    quote = connection.ops.quote_name
    insert = f"INSERT INTO {quote(TaskInstance._meta.db_table)} ({', '.join(quote(field.column) for field in fields)})"
    instances = None
    if connection.vendor == "postgresql":
        # One statement, one array per varying column: thousands of rows of parameters would
        # cost the server seconds of parsing and planning.
        arrays = [field for field in fields if field.name in varying]
        select = [f"u.{quote(field.column)}" if field.name in varying else "%s" for field in fields]
        statement = (
            f"{insert} SELECT {', '.join(select)} FROM unnest("
            + ", ".join(f"%s::{_array_type(field)}[]" for field in arrays)
            + f") AS u({', '.join(quote(field.column) for field in arrays)})"
        )
        params = [*(constants[field.name] for field in fields if field.name not in varying), *(varying[field.name] for field in arrays)]
        if read_back:
            instances = instances_inserted(statement, params)
            for ti in instances:
                ti.dag_run = run
        else:
            sql.execute(statement, params)
    else:  # SQLite, in the process: a prepared statement run for every row costs next to nothing
        columns = [varying.get(field.name) for field in fields]
        rows = [
            [constants[field.name] if column is None else column[at] for field, column in zip(fields, columns)]
            for at in range(len(varying["task_id"]))
        ]
        with connection.cursor() as cursor:
            cursor.executemany(f"{insert} VALUES ({sql.placeholders(len(fields))})", rows)
    tablestats.grew(TaskInstance._meta.db_table, len(varying["task_id"]))
    return instances


def _array_type(field: Any) -> str:
    """The PostgreSQL type of an array of this column's values (a varchar's length left out)."""
    return "text" if field.get_internal_type() == "CharField" else str(field.db_type(connection))


def create_manual_run(
    dag: Dag,
    *,
    conf: dict[str, Any] | None = None,
    triggered_by: str = "",
    now: datetime | None = None,
    logical_date: datetime | str | None = None,
    record: Callable[[DagRun], object] | None = None,
) -> DagRun:
    """`trigger_manual_run`'s run."""
    return trigger_manual_run(dag, conf=conf, triggered_by=triggered_by, now=now, logical_date=logical_date, record=record).run


@dataclass(frozen=True)
class ManualRun:
    """A manual run as its trigger committed it; `instances`: its every task instance as the
    trigger left them, when it knows them all and they are all there is to its document: a run
    started in the trigger's transaction from the instances it inserted (PostgreSQL, a run not
    too big), without mapped tasks (their expansion may add instances) nor deadlines; else None."""

    run: DagRun
    instances: list[TaskInstance] | None = None


def trigger_manual_run(
    dag: Dag,
    *,
    conf: dict[str, Any] | None = None,
    triggered_by: str = "",
    now: datetime | None = None,
    logical_date: datetime | str | None = None,
    record: Callable[[DagRun], object] | None = None,
) -> ManualRun:
    """A manual run: its logical date is `logical_date` (`parse_logical_date`), or else its
    trigger time; its conf is `conf` with the DAG's params filled from their defaults. Its
    run_id is unique however many manual runs share its logical date (`_free_run_id`).

    Bad conf (not a JSON object): BadRequest; a conf the DAG's params refuse: ParamError (a
    BadRequest naming the key); a logical date that is not ISO 8601: LogicalDateError. Nothing is
    created for any of them. A paused DAG's run is created queued, and starts once it is unpaused.

    `record(run)` is called in the run's transaction (the trigger's audit entry), after its
    start: both are committed, or neither. The run is started in that transaction too, its first tasks
    dispatched (one commit for the trigger), unless it is big enough for its instances to be
    analyzed first (`tablestats`): then once they are committed, as the planner's statistics
    must know of them before the first attempt's statements are planned, its first tasks from a
    chunk's worth of rows (`start_big_run`). A start that fails rolls that transaction back, and
    the run is created again, queued (its entry too), for the scheduler's next pass to start.
    """
    given_date = parse_logical_date(logical_date, dag.timezone) if logical_date is not None else None
    if conf is not None and not isinstance(conf, dict):
        raise BadRequest(f"conf must be a JSON object, got {type(conf).__name__}: {conf!r}")
    conf = resolve_conf(dag.params, dag.strict_params, conf)
    now = now or shared_now()
    when = given_date or now
    base = run_id_for(DagRun.RunType.MANUAL, when)
    # The time it is queued, to the microsecond, is as good as never taken: it is inserted
    # without a look first (a clash is the IntegrityError below); a date given is looked up.
    run_id = base if given_date is None else _free_run_id(dag, base)
    # Run once more should a migration have made a prepared statement's plan stale (`sql.once_more_if_stale`).
    create = functools.partial(
        sql.once_more_if_stale, _create_manual_run, dag, logical_date=when, conf=conf, now=now, triggered_by=triggered_by, record=record
    )
    for tries_left in reversed(range(5)):
        try:
            try:
                # A paused DAG's run is created queued, as Airflow does: it starts once the DAG
                # is unpaused (the scheduler starts queued runs of unpaused DAGs).
                return create(run_id=run_id, start=not dag.paused)
            except StartFailed:  # rolled back whole: created again, for the scheduler to start
                log.exception("could not start run %s of DAG %s; the next scheduler pass will", run_id, dag.dag_id)
                return create(run_id=run_id, start=False)
        except IntegrityError:  # another trigger took that id meanwhile: take the next one
            if not tries_left or not DagRun.objects.filter(dag=dag, run_id=run_id).exists():
                raise
            run_id = _free_run_id(dag, base)
    raise AssertionError("unreachable: the last try raises")


def _create_manual_run(
    dag: Dag,
    *,
    run_id: str,
    logical_date: datetime,
    conf: dict[str, Any],
    now: datetime,
    triggered_by: str,
    record: Callable[[DagRun], object] | None,
    start: bool,
) -> ManualRun:
    """`trigger_manual_run`'s transaction: the run created, started when `start` and small
    enough (a start that fails raises StartFailed, its transaction rolled back whole), recorded."""
    with transaction.atomic():
        created = _create_run(
            dag,
            run_type=DagRun.RunType.MANUAL,
            logical_date=logical_date,
            conf=conf,
            now=now,
            triggered_by=triggered_by,
            run_id=run_id,
            read_back=start,
        )
        run, known = created.run, None
        # Started at once, instead of at the next scheduler pass.
        if tablestats.analyzed_after_commit(created.count):
            transaction.on_commit(functools.partial(start_big_run, run.pk))
        elif start:
            start_created_run(run, now, created.instances)
            known = created.instances if _whole_document(created) else None
        if record is not None:
            record(run)  # as the trigger leaves it: running, or queued for a slot
    return ManualRun(run, known)


def _whole_document(created: _Created) -> bool:
    """Whether the instances the run was created and started with, as its start left them, are
    all its document shows (`ManualRun`): no deadline, no mapped task, nothing the dispatch moves
    but through them (`admission.moved_in_place`)."""
    instances = created.instances
    if instances is None or created.has_deadlines:
        return False
    if not all(ti.map_index == -1 and ti.definition is not None and not ti.definition.expand for ti in instances):
        return False
    return moved_in_place(created.run, instances)


class LogicalDateError(BadRequest):
    """A manual run's logical date that is not ISO 8601 (or not a date a run can have)."""

    field = "logical_date"


def parse_logical_date(value: datetime | str, tz_name: str) -> datetime:
    """A manual run's logical date from an ISO 8601 date or date-time (a datetime as it is); a
    naive one is in the DAG's timezone. In UTC, as every stored time (and so in its run_id)."""
    when = value
    if not isinstance(value, datetime):
        if not isinstance(value, str):
            raise LogicalDateError(f"logical_date must be an ISO 8601 date or date-time, not {type(value).__name__}: {value!r:.80}")
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise LogicalDateError(
                f"logical_date is not an ISO 8601 date or date-time: {value!r:.80} (e.g. 2026-01-31T02:00:00, in the DAG's timezone, or with an offset)"
            ) from None
    assert isinstance(when, datetime)
    try:
        return (when if when.tzinfo is not None else when.replace(tzinfo=ZoneInfo(tz_name))).astimezone(dt_timezone.utc)
    except (OverflowError, ValueError):
        raise LogicalDateError(f"logical_date is out of range: {value!r:.80}") from None


def _free_run_id(dag: Dag, base: str) -> str:
    """`base` when no run of the DAG has it, else `base__N` with the first N from 2 that is free:
    two manual runs may share a logical date, never an id."""
    taken = set(DagRun.objects.filter(dag=dag, run_id__startswith=base).values_list("run_id", flat=True))
    number = 2
    candidate = base
    while candidate in taken:
        candidate, number = f"{base}__{number}", number + 1
    return candidate

