"""Reading a little of a run: what a report, a settling or the scheduler needs, whatever the
run's size. Every read here is bounded (by a LIMIT, by the tasks named, or grouped by the
database), and the fan-in tuning that bounds them is here, in one place.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field

from orchestrator.data import sql
from orchestrator.engine.graph import DagGraph
from orchestrator.engine.rules import taking_part
from orchestrator.engine.run_rules import ActiveRuns
from orchestrator.models import Dag, DagRun, Task, TaskInstance
from retries.states import (
    FAILED_TASK_STATES,
    UNFINISHED_TASK_STATES,
    WAITING_TO_RUN_STATES,
    RunState,
    TaskState,
    TriggerRule,
)

# A look at a run's unfinished tasks reads them through their index (ti_run_unfinished), not
# the run's every row: it says `state IN` these (`NOT IN` the finished ones matches no partial
# index) and, when it has a LIMIT, orders by task_id as the index does. Without the order the
# planner may prefer a sequential scan that it expects to stop early, but a run's first rows
# are the ones that finished first: each look then read most of a 10,000-task run.
UNFINISHED = sorted(str(state) for state in UNFINISHED_TASK_STATES)
_FAILED = sorted(str(state) for state in FAILED_TASK_STATES)

# --- the fan-in tuning: how far a report or a pass looks before it reads a run's every task ------

# A task with more upstreams than this is first checked against a bounded read of the run's
# unfinished tasks: the last of a 10,000-task fan-in's upstreams to end reads them all, the
# others only that some of them are still open.
FEW_UPSTREAMS = 64
UNFINISHED_PROBE = 100
# With fewer other tasks of its run unfinished than this, a success report looks again, once
# it is recorded, whether the run is over (more cannot all be ending at the same moment).
NEAR_THE_END = 100
# A downstream task seen waiting for this many other upstreams or more does not have them all
# end with this one: no second look after the report's commit (one read of 100 rows per task of
# a wide fan-in); fewer, and the last of them to end looks again once it is recorded.
CROWDED = 50

# Parameters per IN list (SQLite allows 32,766 per statement).
_CHUNK = 5000
# A report's read of the tasks its task's end may make ready is prepared for up to this many.
PREPARED_READ_TASKS = 8


def locked_run(dag_run_id: int, *, skip_locked: bool) -> DagRun | None:
    """The run with its DAG, its row locked on PostgreSQL (None: gone, or held and skipped)."""
    lock = ""
    if connection.vendor == "postgresql":
        lock = " FOR UPDATE OF r SKIP LOCKED" if skip_locked else " FOR UPDATE OF r"
    return _run_with_dag(f"r.id = %s{lock}", [dag_run_id], prepare=True)  # by primary key (`sql.cursor`)


def run_named(dag_id: str, run_id: str) -> DagRun | None:
    """The run `run_id` of the DAG `dag_id` with its DAG, in one read (None: no such run)."""
    return _run_with_dag("d.dag_id = %s AND r.run_id = %s", [dag_id, run_id])


def _run_with_dag(where: str, params: list[Any], *, prepare: bool = False) -> DagRun | None:
    run_fields, dag_fields = sql.concrete_fields(DagRun), sql.concrete_fields(Dag)
    rows = sql.fetch(
        f"SELECT {sql.columns('r', run_fields)}, {sql.columns('d', dag_fields)}"
        f" FROM orchestrator_dagrun r JOIN orchestrator_dag d ON d.id = r.dag_id WHERE {where}",
        params,
        run_fields + dag_fields,
        prepare=prepare,
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


def instances_of(
    run: DagRun, where: str = "", params: Iterable[Any] = (), *, prepare: bool = False, order_by: str = "ti.id", limit: int | None = None
) -> list[TaskInstance]:
    """The run's task instances (all, or those `where` selects; the first `limit` of them by
    `order_by`) with their definitions, in one written query: the ORM's select_related cost a
    run's every move more CPU than the database spent on it. `prepare`: see `sql.cursor`."""
    ti_fields = [field for field in sql.concrete_fields(TaskInstance) if field.name not in _UNREAD_TI_FIELDS]
    task_fields = sql.concrete_fields(Task, _DEFINITION_FIELDS)
    rows = sql.fetch(
        f"SELECT {sql.columns('ti', ti_fields)}, {sql.columns('t', task_fields)}"
        " FROM orchestrator_taskinstance ti LEFT JOIN orchestrator_task t ON t.id = ti.definition_id"
        f" WHERE ti.dag_run_id = %s{where} ORDER BY {order_by}{'' if limit is None else f' LIMIT {int(limit)}'}",
        [run.pk, *params],
        ti_fields + task_fields,
        prepare=prepare,
    )
    return _with_definitions(rows, ti_fields, task_fields)


def instances_inserted(insert: str, params: Sequence[Any]) -> list[TaskInstance]:
    """The task instances `insert` (an INSERT of task instances, PostgreSQL) adds, as
    `instances_of` would read them, in the same statement: a trigger starts its run with them
    instead of reading back the rows it has just written. Every column: the ones `instances_of`
    leaves unread are empty in a new row."""
    ti_fields = sql.concrete_fields(TaskInstance)
    task_fields = sql.concrete_fields(Task, _DEFINITION_FIELDS)
    rows = sql.fetch(
        f"WITH ti AS ({insert} RETURNING *) SELECT {sql.columns('ti', ti_fields)}, {sql.columns('t', task_fields)}"
        " FROM ti LEFT JOIN orchestrator_task t ON t.id = ti.definition_id ORDER BY ti.id",
        params,
        ti_fields + task_fields,
        prepare=True,  # the same text for any number of tasks (an array per column): planned once
    )
    return _with_definitions(rows, ti_fields, task_fields)


def _with_definitions(rows: list[tuple], ti_fields: list[Field], task_fields: list[Field]) -> list[TaskInstance]:
    """Task instances, each with its definition, from rows of `ti_fields` then `task_fields`."""
    instances = []
    new_ti, new_task, split = sql.builder(TaskInstance, ti_fields), sql.builder(Task, task_fields), len(ti_fields)
    # As `ti.definition = task` leaves it, without the descriptor's checks of every assignment.
    cache_definition = TaskInstance._meta.get_field("definition").set_cached_value
    for row in rows:
        ti = new_ti(row[:split])
        definition = row[split:]
        cache_definition(ti, new_task(definition) if definition[0] is not None else None)
        instances.append(ti)
    return instances



def first_without_upstream(run: DagRun, limit: int) -> list[TaskInstance]:
    """The first `limit` of the run's waiting tasks that have no upstream task, highest priority
    first: in a run none of whose tasks has begun, the only ones that may be ready."""
    empty = "jsonb_array_length(t.upstream) = 0" if connection.vendor == "postgresql" else "json_array_length(t.upstream) = 0"
    return instances_of(
        run,
        f" AND ti.state = {sql.literals([str(TaskState.NONE)])} AND {empty}",
        order_by="ti.priority_weight DESC, ti.id",
        limit=limit,
    )


def waiting_and_due_instances(run: DagRun, task_ids: list[str], now: datetime) -> tuple[list[TaskInstance], list[TaskInstance]]:
    """The run's tasks among `task_ids` that wait to be settled, and the run's tasks due to run
    now (`due_instances_of`), in one query."""
    if len(task_ids) > _CHUNK:
        return waiting_instances(run, task_ids), due_instances_of(run, now)
    due, due_params = _due_condition(now)
    found = instances_of(
        run,
        f" AND ((ti.state = {sql.literals([str(TaskState.NONE)])} AND ti.task_id IN ({sql.placeholders(len(task_ids))})) OR ({due}))",
        [*task_ids, *due_params],
        # A report's read (a chain's step: one task): planned once per connection. Not for many
        # tasks: each count of them is a statement of its own, and would push the moves out of
        # the connection's few prepared statements.
        prepare=len(task_ids) <= PREPARED_READ_TASKS,
    )
    return [ti for ti in found if ti.state == TaskState.NONE], [ti for ti in found if ti.state != TaskState.NONE]


def waiting_instances(run: DagRun, task_ids: list[str]) -> list[TaskInstance]:
    """The run's tasks among `task_ids` that still wait to be settled (state none)."""
    found: list[TaskInstance] = []
    for chunk in _chunks(task_ids):
        found += instances_of(
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
    states = states_of(run, upstream)
    return [state for u in upstream for state in states.get(u, [TaskState.REMOVED])]


def states_of(run: DagRun, task_ids: list[str]) -> dict[str, list[str]]:
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


def due_instances_of(run: DagRun, now: datetime) -> list[TaskInstance]:
    """The run's tasks ready to be dispatched now (index ti_state_run)."""
    due, params = _due_condition(now)
    return instances_of(run, f" AND {due}", params)


def _due_condition(now: datetime) -> tuple[str, list[Any]]:
    """`run_settling.is_due` in SQL, on the task instances aliased `ti`, with its parameters."""
    waiting = sorted(str(state) for state in WAITING_TO_RUN_STATES)
    field = TaskInstance._meta.get_field("next_retry_at")
    return (
        f"ti.state IN ({sql.literals(waiting)}) AND (ti.next_retry_at IS NULL OR ti.next_retry_at <= %s)",
        [field.get_db_prep_save(now, connection)],
    )


def outcome_counted(run: DagRun) -> RunState | None:
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


def run_is_over(dag_run_id: int) -> bool:
    """Whether none of the run's tasks is unfinished (one row read at most)."""
    return not sql.fetch(
        f"SELECT 1 FROM orchestrator_taskinstance WHERE dag_run_id = %s AND state IN ({sql.placeholders(len(UNFINISHED))})"
        " ORDER BY task_id LIMIT 1",
        [dag_run_id, *UNFINISHED],
        [None],
    )


def lock_dag(dag_id: int) -> None:
    """The DAG's row locked for the rest of the transaction (PostgreSQL), in a statement of its
    own: see `active_runs`."""
    sql.fetch("SELECT d.id FROM orchestrator_dag d WHERE d.id = %s FOR NO KEY UPDATE", [dag_id], [None], prepare=True)


def active_runs(dag_id: int, *, locked: bool = False) -> ActiveRuns:
    """The DAG's running and queued runs, counted in one query (a backfill's left out: `run_rules`).
    `locked`: the DAG's row locked for the rest of the transaction on PostgreSQL, so that two
    processes starting its runs do not both count the same slot free (SQLite's transactions take
    the database's write lock). `FOR NO KEY UPDATE`: a trigger that inserted a run of the DAG
    holds a key share of its row, which `FOR UPDATE` would wait for.

    The lock is its own statement, taken before the count: a statement that waited for a lock
    still counts with the snapshot it took before the wait, so a count in the locking statement
    missed the run that the lock's last holder had just started."""
    if locked and connection.vendor == "postgresql":
        lock_dag(dag_id)
    count = "(SELECT COUNT(*) FROM orchestrator_dagrun r WHERE r.dag_id = d.id AND r.state = '{}' AND r.backfill_id IS NULL)"
    rows = sql.fetch(
        f"SELECT {count.format(RunState.RUNNING)}, {count.format(RunState.QUEUED)} FROM orchestrator_dag d WHERE d.id = %s",
        [dag_id],
        [None, None],
        prepare=True,
    )
    running, queued = rows[0] if rows else (0, 0)
    return ActiveRuns(running=running, queued=queued)
