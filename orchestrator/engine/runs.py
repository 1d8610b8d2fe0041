"""A run's life: creating it with its task instances, and moving it on (`advance_run`).

Everything that moves a run lives here: the scheduler's pass, a worker's report, a trigger and
an operator action all call `advance_run()`; nothing here imports the scheduler.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo

from django.db import IntegrityError, connection, transaction

from deadlines import lifecycle
from orchestrator import sql
from orchestrator.clock import shared_now
from orchestrator.engine import enqueuing, storms, tablestats
from orchestrator.engine.admission import dispatch_ready, is_limited
from orchestrator.engine.graph import DagGraph, dag_graph
from orchestrator.engine.limit_args import limit_args
from orchestrator.engine.mapping import expand_ready, is_unexpanded
from orchestrator.engine.rules import Readiness, readiness, run_outcome, taking_part
from orchestrator.engine.transitions import transition_many
from orchestrator.exceptions import BadRequest, Conflict
from orchestrator.listeners import notify
from orchestrator.models import Backfill, Dag, DagRun, Task, TaskAttempt, TaskInstance
from orchestrator.params import resolve_conf
from orchestrator.redis_conn import get_redis
from orchestrator.taskconfig import merge_args
from retries.states import (
    FAILED_TASK_STATES,
    UNFINISHED_TASK_STATES,
    WAITING_TO_RUN_STATES,
    RunState,
    TaskState,
    TriggerRule,
)

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
    with transaction.atomic():
        run = DagRun.objects.create(
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
        _insert_instances(run)
        lifecycle.run_created(run, now)
    return run


def _insert_instances(run: DagRun) -> None:
    """One task instance (state none) per task of the run's DAG.

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
    for pk, task_id, task_args in dag.tasks.order_by("position", "id").values_list("pk", "task_id", "args"):
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
        return
    fields = [field for field in sql.concrete_fields(TaskInstance) if not field.primary_key]
    template = TaskInstance(dag_run=run)
    constants = {
        field.name: field.get_db_prep_save(field.pre_save(template, True), connection) for field in fields if field.name not in varying
    }
    quote = connection.ops.quote_name
    insert = f"INSERT INTO {quote(TaskInstance._meta.db_table)} ({', '.join(quote(field.column) for field in fields)})"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One statement, one array per varying column: thousands of rows of parameters would
            # cost the server seconds of parsing and planning.
            arrays = [field for field in fields if field.name in varying]
            select = [f"u.{quote(field.column)}" if field.name in varying else "%s" for field in fields]
            cursor.execute(
                f"{insert} SELECT {', '.join(select)} FROM unnest("
                + ", ".join(f"%s::{_array_type(field)}[]" for field in arrays)
                + f") AS u({', '.join(quote(field.column) for field in arrays)})",
                [*(constants[field.name] for field in fields if field.name not in varying), *(varying[field.name] for field in arrays)],
            )
        else:  # SQLite, in the process: a prepared statement run for every row costs next to nothing
            columns = [varying.get(field.name) for field in fields]
            rows = [
                [constants[field.name] if column is None else column[at] for field, column in zip(fields, columns)]
                for at in range(len(varying["task_id"]))
            ]
            cursor.executemany(f"{insert} VALUES ({sql.placeholders(len(fields))})", rows)
    tablestats.grew(TaskInstance._meta.db_table, len(varying["task_id"]))


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
) -> DagRun:
    """A manual run: its logical date is `logical_date` (`parse_logical_date`), or else its
    trigger time; its conf is `conf` with the DAG's params filled from their defaults. Its
    run_id is unique however many manual runs share its logical date (`_free_run_id`).

    Bad conf (not a JSON object): BadRequest; a conf the DAG's params refuse: ParamError (a
    BadRequest naming the key); a logical date that is not ISO 8601: LogicalDateError; a paused
    DAG: Conflict. Nothing is created for any of them.
    """
    given_date = parse_logical_date(logical_date, dag.timezone) if logical_date is not None else None
    if conf is not None and not isinstance(conf, dict):
        raise BadRequest(f"conf must be a JSON object, got {type(conf).__name__}: {conf!r}")
    if dag.paused:
        raise Conflict(f"DAG '{dag.dag_id}' is paused; unpause it to trigger a run")
    conf = resolve_conf(dag.params, dag.strict_params, conf)
    now = now or shared_now()
    when = given_date or now
    for tries_left in reversed(range(5)):
        run_id = _free_run_id(dag, run_id_for(DagRun.RunType.MANUAL, when))
        try:
            run = create_run(
                dag, run_type=DagRun.RunType.MANUAL, logical_date=when, conf=conf, now=now, triggered_by=triggered_by, run_id=run_id
            )
            break
        except IntegrityError:  # another trigger took that id meanwhile: take the next one
            if not tries_left or not DagRun.objects.filter(dag=dag, run_id=run_id).exists():
                raise
    # Start it at once instead of waiting for the next scheduler pass.
    transaction.on_commit(lambda: advance_run_now(run.pk))
    return run


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


# --- moving a run on ---------------------------------------------------------------------------


def advance_run(
    dag_run_id: int,
    now: datetime | None = None,
    *,
    skip_locked: bool = False,
    ended: str | None = None,
    ended_states: list[str] | None = None,
    savepoint: bool = True,
) -> tuple[int, bool]:
    """Start the run, settle tasks whose upstreams are done, dispatch ready ones, end the run.

    Returns (tasks dispatched, whether the run finished). Safe to call from any process at
    any time: each change is conditional, so concurrent callers cannot double-dispatch. On
    PostgreSQL the run row is locked for the pass; schedulers skip a run another process
    holds (`skip_locked`), while a worker that just finished a task waits for it, so its
    downstream tasks are dispatched at once.

    `ended` names the task whose end calls this (a report): then only that task's downstream
    is settled and the rest of the run is counted in SQL, so a report costs the same however
    wide its run is. Without it (the scheduler, an operator action) the whole run is read.
    `ended_states`, when the caller knows them, are the states of every instance of `ended`
    (a task that is not mapped has one): they are then not read again. Inside a caller's
    transaction it takes a savepoint unless `savepoint` is False (a report, which rolls back
    whole if this fails: `reporting._with_advance_or_alone`).

    The first FIRST_DISPATCH_CHUNK due tasks are dispatched in this transaction, the rest once it
    commits (`dispatch_later`), so a wide run's first jobs are on Redis before the rest are
    written; the count returned includes them when this is the outermost transaction.
    """
    now = now or shared_now()
    later: list[TaskInstance] = []  # due tasks past the first chunk: dispatched after the commit
    dispatched_later: list[int] = []
    # Tasks made ready whose `scheduled` is not written: the dispatch moves them on from `none`.
    unwritten: dict[int, TaskInstance] = {}
    with transaction.atomic(savepoint=savepoint):
        run = _locked_run(dag_run_id, skip_locked=skip_locked)
        if run is None or run.state not in (RunState.QUEUED, RunState.RUNNING):
            return 0, False
        if run.state == RunState.QUEUED and not _start_run(run, now):
            return 0, False
        if run.dag.paused and run.backfill_id is None:  # a backfill's runs go on while their DAG is paused
            return 0, False
        if ended is None:
            instances = _instances_of(run)
            for ti in instances:
                ti.dag_run = run
            _settle(instances, now)  # adds the instances of the mapped tasks it expands
            due = [ti for ti in instances if _due(ti, now)]
            outcome = run_outcome([ti.state for ti in instances])
        else:
            due = _settle_downstream_of(run, ended, now, ended_states, unwritten)
            removed = [ti for ti in due if _removed_while_waiting(ti)]
            _apply(_decide(removed, lambda ti: []), now)
            due = [ti for ti in due if ti not in removed]
            # A task due to run is not finished: the run cannot be over, nothing to count.
            outcome = None if due else _outcome_counted(run)
        for ti in due:
            ti.dag_run = run
        due.sort(key=lambda ti: -ti.priority_weight)  # stable: by id within a weight
        due, later = due[:FIRST_DISPATCH_CHUNK], due[FIRST_DISPATCH_CHUNK:]
        # The later chunks' tasks made ready in memory stay `none` until their own chunk moves
        # them on: a wide fan-out's report does not write `scheduled` for thousands of tasks
        # before its first jobs can go. Left so by a crash, they are `none` tasks whose
        # upstreams are done, and the scheduler's next pass settles them.
        later_unwritten = {ti.pk: unwritten.pop(ti.pk) for ti in later if ti.pk in unwritten}
        # Pools, limits and circuits decide which of the ready tasks go now.
        dispatched = dispatch_ready(run, due, now, unwritten=frozenset(unwritten))
        _write_unwritten(unwritten)  # made ready but not dispatched after all: scheduled
        finished = _finish_if_done(run, outcome, now)
        if later:
            # Registered after the first chunk's enqueue: its jobs are on Redis before the next
            # chunk is written.
            transaction.on_commit(
                lambda: dispatched_later.append(dispatch_later(dag_run_id, later, now, unwritten=later_unwritten))
            )
        # An attempt row for each task dispatched (registered after the later chunks: counted once they are written).
        tablestats.grew(TaskAttempt._meta.db_table, len(due) + len(later))
    return dispatched + sum(dispatched_later), finished


# A wide run's due tasks are dispatched in committed chunks: the first (enough to fill a few
# workers' slots) with the run's settling, the others, of DISPATCH_CHUNK each, in a transaction
# of their own after that commit. The first tasks' jobs reach Redis (and a worker) while the
# rest are still being written, instead of after one transaction that writes them all.
FIRST_DISPATCH_CHUNK = 100
DISPATCH_CHUNK = 500


def dispatch_later(
    dag_run_id: int, due: list[TaskInstance], now: datetime, *, unwritten: dict[int, TaskInstance] | None = None
) -> int:
    """Dispatch the rest of a run's due tasks, a chunk per transaction, once the transaction that
    settled them committed; returns how many went. `unwritten`: those of them still `none` in
    the database (`_settle_downstream_of`); each chunk writes `scheduled` for any of its own it
    does not dispatch.

    Each chunk locks the run again and goes only while the run is running and its DAG not
    paused. Every dispatch is fenced by the (state, token) it was read with, so a task someone
    else dispatched or cleared meanwhile is left alone, and pools, limits and circuits admit
    each chunk under their locks as they would any dispatch. Whatever is not dispatched here
    (an error, a crash between chunks) stays scheduled, or `none` with its upstreams done, and
    the next scheduler pass, which looks for runs with due or settleable tasks, dispatches it:
    the error is logged, never raised into the caller, whose own change is committed already."""
    dispatched = 0
    try:
        for start in range(0, len(due), DISPATCH_CHUNK):
            _mark_dispatching(dag_run_id)
            went = _dispatch_chunk_later(dag_run_id, due, start, now, unwritten)
            if went is None:
                return dispatched
            dispatched += went
    finally:
        _mark_dispatched(dag_run_id)
    return dispatched


def _dispatch_chunk_later(
    dag_run_id: int, due: list[TaskInstance], start: int, now: datetime, unwritten: dict[int, TaskInstance] | None
) -> int | None:
    """One chunk of `dispatch_later` in its own transaction: how many went, or None to stop (the
    run is no longer running, its DAG paused, or the chunk failed)."""
    chunk = due[start : start + DISPATCH_CHUNK]
    try:
        with transaction.atomic():
            run = _locked_run(dag_run_id, skip_locked=False)
            if run is None or run.state != RunState.RUNNING or (run.dag.paused and run.backfill_id is None):
                return None
            for ti in chunk:
                ti.dag_run = run
            chunk_unwritten = {ti.pk: ti for ti in chunk if unwritten and ti.pk in unwritten}
            went = dispatch_ready(run, chunk, now, unwritten=frozenset(chunk_unwritten))
            _write_unwritten(chunk_unwritten)
    except Exception:
        log.exception("could not dispatch %d due task(s) of run %s; the next scheduler pass will", len(due) - start, dag_run_id)
        return None
    return went


def _mark_dispatching(dag_run_id: int) -> None:
    """Tell the scheduler this run's chunks are on their way (`enqueuing`); without Redis the
    scheduler may race the chunks, which the fences make safe."""
    try:
        enqueuing.dispatching(get_redis(), dag_run_id)
    except Exception:
        log.warning("could not mark run %s as being dispatched", dag_run_id, exc_info=True)


def _mark_dispatched(dag_run_id: int) -> None:
    try:
        enqueuing.dispatched(get_redis(), dag_run_id)
    except Exception:
        log.warning("could not clear run %s's dispatch marker; it expires", dag_run_id, exc_info=True)


def _locked_run(dag_run_id: int, *, skip_locked: bool) -> DagRun | None:
    """The run with its DAG, its row locked on PostgreSQL (None: gone, or held and skipped)."""
    run_fields, dag_fields = sql.concrete_fields(DagRun), sql.concrete_fields(Dag)
    lock = ""
    if connection.vendor == "postgresql":
        lock = " FOR UPDATE OF r SKIP LOCKED" if skip_locked else " FOR UPDATE OF r"
    rows = sql.fetch(
        f"SELECT {sql.columns('r', run_fields)}, {sql.columns('d', dag_fields)}"
        f" FROM orchestrator_dagrun r JOIN orchestrator_dag d ON d.id = r.dag_id WHERE r.id = %s{lock}",
        [dag_run_id],
        run_fields + dag_fields,
        prepare=True,  # by primary keys (`sql.cursor`)
    )
    if not rows:
        return None
    run = sql.instances(DagRun, run_fields, rows[0][: len(run_fields)])
    run.dag = sql.instances(Dag, dag_fields, rows[0][len(run_fields) :])
    return run


# What advance_run() reads of a task's definition; anything else is deferred (read on use).
_DEFINITION_FIELDS = ("id", "dag", "task_id", "upstream", "trigger_rule", "args", "expand")
# Up to ORCHESTRATOR_RESULT_MAX_BYTES each: read only where needed (an expansion, a claim).
_UNREAD_TI_FIELDS = ("result", "map_item")


def _instances_of(run: DagRun, where: str = "", params: Iterable[Any] = (), *, prepare: bool = False) -> list[TaskInstance]:
    """The run's task instances (all, or those `where` selects) with their definitions, in one
    written query: the ORM's select_related cost a run's every move more CPU than the database
    spent on it. `prepare`: see `sql.cursor`."""
    ti_fields = [field for field in sql.concrete_fields(TaskInstance) if field.name not in _UNREAD_TI_FIELDS]
    task_fields = sql.concrete_fields(Task, _DEFINITION_FIELDS)
    rows = sql.fetch(
        f"SELECT {sql.columns('ti', ti_fields)}, {sql.columns('t', task_fields)}"
        " FROM orchestrator_taskinstance ti LEFT JOIN orchestrator_task t ON t.id = ti.definition_id"
        f" WHERE ti.dag_run_id = %s{where} ORDER BY ti.id",
        [run.pk, *params],
        ti_fields + task_fields,
        prepare=prepare,
    )
    instances = []
    for row in rows:
        ti = sql.instances(TaskInstance, ti_fields, row[: len(ti_fields)])
        definition = row[len(ti_fields) :]
        ti.definition = sql.instances(Task, task_fields, definition) if definition[0] is not None else None
        instances.append(ti)
    return instances


def advance_run_now(dag_run_id: int, *, ended: str | None = None) -> None:
    """Move a run on right after a report or an operator action, instead of at the next pass.

    The change that called it is already saved; if this fails, the scheduler's next pass does
    the same work, so the failure is logged and never raised into the caller.
    """
    try:
        advance_run(dag_run_id, ended=ended)
    except Exception:
        log.exception("could not advance run %s; the next scheduler pass will", dag_run_id)


def _due(ti: TaskInstance, now: datetime) -> bool:
    return ti.state in (TaskState.SCHEDULED, TaskState.UP_FOR_RETRY) and (
        ti.next_retry_at is None or ti.next_retry_at <= now
    )


def _start_run(run: DagRun, now: datetime) -> bool:
    # The DAG row is locked while counting and starting: two schedulers (or a trigger and a
    # scheduler) starting runs of one DAG at once would each count the same running runs.
    if connection.vendor == "postgresql":
        Dag.objects.select_for_update().filter(pk=run.dag_id).values_list("pk", flat=True).first()
    # A backfill's runs count against the backfill's own limit (engine.backfills), not this one.
    running = DagRun.objects.filter(dag_id=run.dag_id, state=RunState.RUNNING, backfill__isnull=True).count()
    if running >= run.dag.max_active_runs:
        return False
    started = DagRun.objects.filter(pk=run.pk, state=RunState.QUEUED).update(state=RunState.RUNNING, start_date=now)
    if started:
        run.state, run.start_date = RunState.RUNNING, now
        return True
    run.refresh_from_db(fields=["state", "start_date"])
    return run.state == RunState.RUNNING


def _settle(instances: list[TaskInstance], now: datetime) -> None:
    """Decide the waiting tasks whose upstreams allow it: ready (scheduled), upstream_failed,
    skipped or removed; a mapped task that may run expands instead (`mapping.expand_ready`), and
    its new instances join `instances`. A task removed from its DAG while it waited to run
    (scheduled, or up_for_retry) is removed too, not dispatched to fail for want of a definition
    and spend the user's retries. One statement per kind of decision; settling one task can
    decide its downstream, so it repeats (in memory) until nothing changes."""
    while True:
        states = _states_by_task(instances)
        waiting = [ti for ti in instances if ti.state == TaskState.NONE or _removed_while_waiting(ti)]
        decided = _decide(waiting, functools.partial(_known_upstream_states, states))
        expanded, created = _expand_decided(decided, now)
        instances += created
        if not (_apply(decided, now) or expanded):
            return


def _known_upstream_states(states: dict[str, list[str]], ti: TaskInstance) -> list[str]:
    """The states of every instance of `ti`'s upstream tasks (a missing upstream counts as removed)."""
    return [state for u in _upstream_of(ti) for state in states.get(u, [TaskState.REMOVED])]


def _states_by_task(instances: list[TaskInstance]) -> dict[str, list[str]]:
    """Each task's instances' states (one for a task that is not mapped)."""
    states: dict[str, list[str]] = {}
    for ti in instances:
        states.setdefault(ti.task_id, []).append(ti.state)
    return {task_id: taking_part(task_states) for task_id, task_states in states.items()}


def _expand_decided(
    decided: dict[TaskState, list[TaskInstance]], now: datetime
) -> tuple[list[TaskInstance], list[TaskInstance]]:
    """Expand the mapped tasks among those decided ready (taking them out of `decided`).
    Returns the placeholders that moved (to instance 0, skipped or failed) and the instances
    created beside them, ready to dispatch."""
    moved: list[TaskInstance] = []
    created: list[TaskInstance] = []
    for ti in [ti for ti in decided.get(TaskState.SCHEDULED, []) if is_unexpanded(ti)]:
        decided[TaskState.SCHEDULED].remove(ti)
        expanded = expand_ready(ti, now)
        if expanded is None:
            continue  # another process expanded it: its next pass reads the instances
        moved.append(ti)
        for instance in expanded[1][1:]:
            instance.dag_run, instance.definition = ti.dag_run, ti.definition
            created.append(instance)
    return moved, created


def _removed_while_waiting(ti: TaskInstance) -> bool:
    """Removed from its DAG while it waited to run (scheduled, or up_for_retry): it becomes
    removed, not dispatched to fail for want of a definition and spend the user's retries."""
    return ti.definition is None and ti.state in WAITING_TO_RUN_STATES


def _settle_downstream_of(
    run: DagRun, ended: str, now: datetime, ended_states: list[str] | None, unwritten: dict[int, TaskInstance]
) -> list[TaskInstance]:
    """Settle only what the end of task `ended` can decide: its waiting downstream tasks, and
    theirs in turn when one is decided without running (upstream_failed, skipped, removed).
    The rest of the run is not read. Returns the run's tasks due to run now: those it made
    ready, and those that were due already (read with its first waiting tasks, in one query).

    A task it makes ready that nothing but the dispatch's own fence can hold (no circuit, no
    pool or limit, its queue not paused) is `scheduled` in memory only, and put in `unwritten`:
    the dispatch moves it from `none` to `queued` in one statement (a chain's step writes the
    next task once, not twice). The caller writes `scheduled` for any of them it did not
    dispatch (`_write_unwritten`)."""
    graph = dag_graph(run.dag)
    first_downstream = sorted(graph.downstream.get(ended, ()))
    if not first_downstream:
        return _due_instances_of(run, now)
    # The tasks just ended or decided: their instances' states.
    frontier = {ended: ended_states} if ended_states else _states_of(run, [ended])
    waiting, due = _waiting_and_due_instances(run, first_downstream, now)
    any_expanded = False
    while True:
        for ti in waiting:
            ti.dag_run = run
        decided = _decide(waiting, functools.partial(_upstream_states_of, run, frontier))
        expanded, _ = _expand_decided(decided, now)
        any_expanded = any_expanded or bool(expanded)
        settled = _apply(decided, now, defer=functools.partial(_dispatched_at_once, run, now), unwritten=unwritten) + expanded
        due += [ti for ti in settled if _due(ti, now)]
        frontier = _states_of(run, sorted({ti.task_id for ti in settled if ti.state != TaskState.SCHEDULED}))
        if not frontier:
            break
        waiting = _waiting_instances(run, sorted({d for task_id in frontier for d in graph.downstream.get(task_id, ())}))
    if any_expanded:
        _write_unwritten(unwritten)  # the read below must see them
        return _due_instances_of(run, now)  # with the instances the expansion created
    return sorted(due, key=lambda ti: ti.pk)


def _upstream_states_of(run: DagRun, known: dict[str, list[str]], ti: TaskInstance) -> list[str]:
    return upstream_states(run, _upstream_of(ti), known)


def _upstream_of(ti: TaskInstance) -> list[str]:
    return list(ti.definition.upstream) if ti.definition is not None else []


def _decide(
    waiting: list[TaskInstance], upstream_states_of: Callable[[TaskInstance], list[str]]
) -> dict[TaskState, list[TaskInstance]]:
    """What each waiting task becomes now, grouped by decision (a task that must wait is left out)."""
    decided: dict[TaskState, list[TaskInstance]] = {}
    for ti in waiting:
        target = _settled_state(ti, upstream_states_of)
        if target is not None:
            decided.setdefault(target, []).append(ti)
    return decided


def _apply(
    decided: dict[TaskState, list[TaskInstance]],
    now: datetime,
    *,
    defer: Callable[[TaskInstance], bool] | None = None,
    unwritten: dict[int, TaskInstance] | None = None,
) -> list[TaskInstance]:
    """Record the decisions, one fenced statement per kind; returns the tasks that moved. A task
    made `scheduled` that `defer` picks is only marked so in memory and put in `unwritten`
    (see `_settle_downstream_of`)."""
    settled = []
    for target, tis in decided.items():
        if target == TaskState.SCHEDULED and defer is not None and unwritten is not None:
            for ti in [ti for ti in tis if defer(ti)]:
                unwritten[ti.pk] = ti
                ti.state = target
                settled.append(ti)
            tis = [ti for ti in tis if ti.pk not in unwritten]
            if not tis:
                continue
        changes: dict[str, Any] = {"state": target}
        if target != TaskState.SCHEDULED:
            changes["end_date"] = now
        won = transition_many([(ti.pk, ti.attempt_token, ti.state) for ti in tis], **changes)
        for ti in tis:
            if ti.pk in won:
                ti.state = target
                settled.append(ti)
                if target in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED):
                    lifecycle.task_finished(ti, now)  # a removed task's deadlines end with its run
    return settled


def _dispatched_at_once(run: DagRun, now: datetime, ti: TaskInstance) -> bool:
    """Whether a task made ready now goes to the dispatch with nothing but its fence to pass:
    no circuit, no pool or limit (`admission`), its queue not paused."""
    return not ti.circuit and not is_limited(ti, run.dag) and ti.queue not in storms.paused_queues(now)


def _write_unwritten(unwritten: dict[int, TaskInstance]) -> None:
    """Write `scheduled` for the tasks made ready in memory only (`_settle_downstream_of`) that
    were not dispatched after all (a gate that closed meanwhile, the rest of a wide run)."""
    left = [ti for ti in unwritten.values() if ti.state == TaskState.SCHEDULED]
    unwritten.clear()
    if left:
        transition_many([(ti.pk, ti.attempt_token, TaskState.NONE) for ti in left], state=TaskState.SCHEDULED)


def _settled_state(ti: TaskInstance, upstream_states_of: Callable[[TaskInstance], list[str]]) -> TaskState | None:
    """What a waiting task becomes now, or None while it must wait."""
    if ti.definition is None:
        return TaskState.REMOVED
    verdict = readiness(ti.definition.trigger_rule, upstream_states_of(ti))
    if verdict is Readiness.WAIT:
        return None
    return {
        Readiness.RUN: TaskState.SCHEDULED,
        Readiness.UPSTREAM_FAILED: TaskState.UPSTREAM_FAILED,
        Readiness.SKIPPED: TaskState.SKIPPED,
    }[verdict]


# --- reading a little of a run: what a report needs, whatever the run's size --------------------

# A look at a run's unfinished tasks reads them through their index (ti_run_unfinished), not
# the run's every row: it says `state IN` these (`NOT IN` the finished ones matches no partial
# index) and, when it has a LIMIT, orders by task_id as the index does. Without the order the
# planner may prefer a sequential scan that it expects to stop early, but a run's first rows
# are the ones that finished first: each look then read most of a 10,000-task run.
UNFINISHED = sorted(str(state) for state in UNFINISHED_TASK_STATES)
_FAILED = sorted(str(state) for state in FAILED_TASK_STATES)
# A task with more upstreams than this is first checked against a bounded read of the run's
# unfinished tasks: the last of a 10,000-task fan-in's upstreams to end reads them all, the
# others only that some of them are still open.
FEW_UPSTREAMS = 64
UNFINISHED_PROBE = 100
# Parameters per IN list (SQLite allows 32,766 per statement).
_CHUNK = 5000
# A report's read of the tasks its task's end may make ready is prepared for up to this many.
PREPARED_READ_TASKS = 8


def _waiting_and_due_instances(run: DagRun, task_ids: list[str], now: datetime) -> tuple[list[TaskInstance], list[TaskInstance]]:
    """The run's tasks among `task_ids` that wait to be settled, and the run's tasks due to run
    now (`_due_instances_of`), in one query."""
    if len(task_ids) > _CHUNK:
        return _waiting_instances(run, task_ids), _due_instances_of(run, now)
    due, due_params = _due_condition(now)
    found = _instances_of(
        run,
        f" AND ((ti.state = {sql.literals([str(TaskState.NONE)])} AND ti.task_id IN ({sql.placeholders(len(task_ids))})) OR ({due}))",
        [*task_ids, *due_params],
        # A report's read (a chain's step: one task): planned once per connection. Not for many
        # tasks: each count of them is a statement of its own, and would push the moves out of
        # the connection's few prepared statements.
        prepare=len(task_ids) <= PREPARED_READ_TASKS,
    )
    return [ti for ti in found if ti.state == TaskState.NONE], [ti for ti in found if ti.state != TaskState.NONE]


def _waiting_instances(run: DagRun, task_ids: list[str]) -> list[TaskInstance]:
    """The run's tasks among `task_ids` that still wait to be settled (state none)."""
    found: list[TaskInstance] = []
    for chunk in _chunks(task_ids):
        found += _instances_of(
            run, f" AND ti.state = %s AND ti.task_id IN ({sql.placeholders(len(chunk))})", [str(TaskState.NONE), *chunk]
        )
    return found


def upstream_states(run: DagRun, upstream: list[str], known: dict[str, list[str]]) -> list[str]:
    """The states of a task's upstream tasks in `run`, as far as they decide something.

    For a wide fan-in, a bounded read of the run's unfinished tasks usually shows one of the
    upstreams still open: then it returns those, with the `known` states of the tasks that just
    ended. While an upstream is open the trigger rules can only act on a failure or a success
    seen, and every earlier end was looked at by its own report (or the scheduler's pass), so
    the newest ends are what can decide now. Otherwise every upstream's state is read. An
    upstream with no task instance (removed from the DAG) counts as removed.
    """
    if all(task_id in known for task_id in upstream):
        return [state for task_id in upstream for state in known[task_id]]  # a chain's step: read already
    if len(upstream) > FEW_UPSTREAMS:
        wanted = set(upstream)
        open_tasks = sql.fetch(
            f"SELECT task_id, state FROM orchestrator_taskinstance WHERE dag_run_id = %s"
            f" AND state IN ({sql.placeholders(len(UNFINISHED))}) ORDER BY task_id LIMIT %s",
            [run.pk, *UNFINISHED, UNFINISHED_PROBE],
            [None, None],
        )
        open_upstream = [state for task_id, state in open_tasks if task_id in wanted]
        if open_upstream:
            return open_upstream + [state for task_id, states in known.items() if task_id in wanted for state in states]
    states = _states_of(run, upstream)
    return [state for u in upstream for state in states.get(u, [TaskState.REMOVED])]


def _states_of(run: DagRun, task_ids: list[str]) -> dict[str, list[str]]:
    """The states the run's instances of these tasks are in, each once: the trigger rules ask
    only which states occur, so a mapped task of 10,000 instances costs a few rows, grouped by
    the database, not 10,000."""
    states: dict[str, list[str]] = {}
    for chunk in _chunks(task_ids):
        for task_id, state in sql.fetch(
            f"SELECT task_id, state FROM orchestrator_taskinstance WHERE dag_run_id = %s"
            f" AND task_id IN ({sql.placeholders(len(chunk))}) GROUP BY task_id, state",
            [run.pk, *chunk],
            [None, None],
        ):
            states.setdefault(task_id, []).append(state)
    return {task_id: taking_part(task_states) for task_id, task_states in states.items()}


def downstream_may_settle(dag_run_id: int, graph: DagGraph, succeeded: str) -> bool:
    """Whether the success of `succeeded` (counted as ended, whether or not it is recorded yet)
    may let one of its downstream tasks be settled now, read without any lock. False only when each of them needs all its upstreams done and one of
    them is still open: then a fan-in's other upstreams' reports need not queue behind the run's
    lock. (Two last upstreams ending at once may each see the other open: each looks again
    after its commit, and the later one sees both ended.)"""
    return fewest_open_upstreams(dag_run_id, graph, succeeded) == 0


def fewest_open_upstreams(dag_run_id: int, graph: DagGraph, succeeded: str) -> int:
    """`downstream_may_settle` as a number: 0 when one of the tasks downstream of `succeeded` may
    be settled now, else the fewest upstreams seen open (other than `succeeded`) of any of them,
    up to UNFINISHED_PROBE (also when it has no downstream task)."""
    open_tasks: set[str] | None = None
    fewest = UNFINISHED_PROBE
    for task_id in graph.downstream.get(succeeded, ()):
        if graph.trigger_rule.get(task_id) == TriggerRule.ONE_SUCCESS:
            return 0
        upstream = graph.upstream.get(task_id, frozenset())
        if upstream <= {succeeded}:
            return 0  # it waits for nothing else: no need to look at the run
        if open_tasks is None:
            open_tasks = {
                name for (name,) in sql.fetch(
                    f"SELECT task_id FROM orchestrator_taskinstance WHERE dag_run_id = %s AND task_id <> %s"
                    f" AND state IN ({sql.placeholders(len(UNFINISHED))}) ORDER BY task_id LIMIT %s",
                    [dag_run_id, succeeded, *UNFINISHED, UNFINISHED_PROBE],
                    [None],
                )
            }
        # none of its upstreams seen open: 0 (the read is bounded: maybe more are)
        fewest = min(fewest, len(open_tasks & upstream))
        if fewest == 0:
            return 0
    return fewest


def _due_instances_of(run: DagRun, now: datetime) -> list[TaskInstance]:
    """The run's tasks ready to be dispatched now (index ti_state_run)."""
    due, params = _due_condition(now)
    return _instances_of(run, f" AND {due}", params)


def _due_condition(now: datetime) -> tuple[str, list[Any]]:
    """`_due` in SQL, on the task instances aliased `ti`, with its parameters."""
    waiting = sorted(str(state) for state in WAITING_TO_RUN_STATES)
    field = TaskInstance._meta.get_field("next_retry_at")
    return (
        f"ti.state IN ({sql.literals(waiting)}) AND (ti.next_retry_at IS NULL OR ti.next_retry_at <= %s)",
        [field.get_db_prep_save(now, connection)],
    )


def _outcome_counted(run: DagRun) -> RunState | None:
    """The run's outcome once every task is done (else None), counted by the database."""
    ((any_open, any_failed),) = sql.fetch(
        f"SELECT EXISTS (SELECT 1 FROM orchestrator_taskinstance WHERE dag_run_id = %s AND state IN ({sql.placeholders(len(UNFINISHED))})),"
        f" EXISTS (SELECT 1 FROM orchestrator_taskinstance WHERE dag_run_id = %s AND state IN ({sql.placeholders(len(_FAILED))}))",
        [run.pk, *UNFINISHED, run.pk, *_FAILED],
        [None, None],
    )
    if any_open:
        return None
    return RunState.FAILED if any_failed else RunState.SUCCESS


def _chunks(values: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


def _finish_if_done(run: DagRun, outcome: RunState | None, now: datetime) -> bool:
    """End the run if every task is done (`outcome` is not None). The outcome may be a little
    stale: a task that finished since is seen by its worker's own advance_run(), which waits
    for our lock."""
    if outcome is None:
        return False
    with transaction.atomic(savepoint=False):
        ended = DagRun.objects.filter(pk=run.pk, state=RunState.RUNNING).update(state=outcome, end_date=now)
        if not ended:
            return False
        run.state, run.end_date = outcome, now
        lifecycle.run_finished(run, now)
        hook = "on_dag_run_success" if outcome == RunState.SUCCESS else "on_dag_run_failed"
        transaction.on_commit(lambda: notify(hook, dag_run=run))
    return True
