"""A run's life: creating it with its task instances, and moving it on (`advance_run`).

Everything that moves a run lives here: the scheduler's pass, a worker's report, a trigger and
an operator action all call `advance_run()`; nothing here imports the scheduler.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from deadlines import lifecycle
from orchestrator.engine import sql
from orchestrator.engine.clock import shared_now
from orchestrator.engine.limitconfig import limit_args
from orchestrator.engine.limits import dispatch_ready
from orchestrator.engine.mapping import expand_ready, is_unexpanded
from orchestrator.engine.rules import Readiness, readiness, run_outcome
from orchestrator.engine.taskconfig import effective_args
from orchestrator.engine.transitions import transition_many
from orchestrator.exceptions import BadRequest, Conflict
from orchestrator.listeners import notify
from orchestrator.models import Backfill, Dag, DagRun, Task, TaskInstance
from retries.states import WAITING_TO_RUN_STATES, RunState, TaskState

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
) -> DagRun:
    """Insert the run and one task instance per task, in one transaction."""
    now = now or shared_now()
    with transaction.atomic():
        run = DagRun.objects.create(
            dag=dag,
            run_id=run_id_for(run_type, logical_date),
            run_type=run_type,
            state=RunState.QUEUED,
            conf=conf or {},
            logical_date=logical_date,
            queued_at=now,
            triggered_by=triggered_by,
            backfill=backfill,
        )
        instances = []
        for task in dag.tasks.all():
            task.dag = dag
            args = effective_args(task)
            limits = limit_args(task.args, dag.default_args)
            instances.append(
                TaskInstance(
                    dag_run=run,
                    definition=task,
                    task_id=task.task_id,
                    max_tries=int(args["retries"]) + 1,
                    infrastructure_retry_limit=int(args["infrastructure_retry_limit"]),
                    queue=str(args["queue"]),
                    pool=limits["pool"],
                    pool_slots=int(limits["pool_slots"]),
                    priority_weight=int(limits["priority_weight"]),
                    circuit=limits["circuit"],
                )
            )
        TaskInstance.objects.bulk_create(instances)
        lifecycle.run_created(run, now)
    return run


def create_manual_run(
    dag: Dag, *, conf: dict[str, Any] | None = None, triggered_by: str = "", now: datetime | None = None
) -> DagRun:
    """A manual run: its logical date is its trigger time.

    Bad conf (not a JSON object): BadRequest; a paused DAG: Conflict.
    """
    if conf is not None and not isinstance(conf, dict):
        raise BadRequest(f"conf must be a JSON object, got {type(conf).__name__}: {conf!r}")
    if dag.paused:
        raise Conflict(f"DAG '{dag.dag_id}' is paused; unpause it to trigger a run")
    now = now or shared_now()
    run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now, conf=conf, now=now, triggered_by=triggered_by)
    # Start it at once instead of waiting for the next scheduler pass.
    transaction.on_commit(lambda: advance_run_now(run.pk))
    return run


# --- moving a run on ---------------------------------------------------------------------------


def advance_run(dag_run_id: int, now: datetime | None = None, *, skip_locked: bool = False) -> tuple[int, bool]:
    """Start the run, settle tasks whose upstreams are done, dispatch ready ones, end the run.

    Returns (tasks dispatched, whether the run finished). Safe to call from any process at
    any time: each change is conditional, so concurrent callers cannot double-dispatch. On
    PostgreSQL the run row is locked for the pass; schedulers skip a run another process
    holds (`skip_locked`), while a worker that just finished a task waits for it, so its
    downstream tasks are dispatched at once.
    """
    now = now or shared_now()
    with transaction.atomic():
        run = _locked_run(dag_run_id, skip_locked=skip_locked)
        if run is None or run.state not in (RunState.QUEUED, RunState.RUNNING):
            return 0, False
        if run.state == RunState.QUEUED and not _start_run(run, now):
            return 0, False
        if run.dag.paused and run.backfill_id is None:  # a backfill's runs go on while their DAG is paused
            return 0, False
        instances = _instances_of(run)
        for ti in instances:
            ti.dag_run = run
        states = _states_by_task(instances)
        _settle(instances, states, now)  # adds the instances of the mapped tasks it expands
        # Pools, limits and circuits decide which of the ready tasks go now.
        dispatched = dispatch_ready(run, [ti for ti in instances if _due(ti, now)], now)
        return dispatched, _finish_if_done(run, [s for task_states in states.values() for s in task_states], now)


def _locked_run(dag_run_id: int, *, skip_locked: bool) -> DagRun | None:
    """The run with its DAG, its row locked on PostgreSQL (None: gone, or held and skipped)."""
    run_fields, dag_fields = list(DagRun._meta.concrete_fields), list(Dag._meta.concrete_fields)
    lock = ""
    if connection.vendor == "postgresql":
        lock = " FOR UPDATE OF r SKIP LOCKED" if skip_locked else " FOR UPDATE OF r"
    rows = sql.fetch(
        f"SELECT {sql.columns('r', run_fields)}, {sql.columns('d', dag_fields)}"
        f" FROM orchestrator_dagrun r JOIN orchestrator_dag d ON d.id = r.dag_id WHERE r.id = %s{lock}",
        [dag_run_id],
        run_fields + dag_fields,
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


def _instances_of(run: DagRun) -> list[TaskInstance]:
    """The run's task instances with their definitions, in one written query: the ORM's
    select_related cost a run's every move more CPU than the database spent on it."""
    ti_fields = [field for field in TaskInstance._meta.concrete_fields if field.name not in _UNREAD_TI_FIELDS]
    task_fields = [Task._meta.get_field(name) for name in _DEFINITION_FIELDS]
    rows = sql.fetch(
        f"SELECT {sql.columns('ti', ti_fields)}, {sql.columns('t', task_fields)}"
        " FROM orchestrator_taskinstance ti LEFT JOIN orchestrator_task t ON t.id = ti.definition_id"
        " WHERE ti.dag_run_id = %s ORDER BY ti.id",
        [run.pk],
        ti_fields + task_fields,
    )
    instances = []
    for row in rows:
        ti = sql.instances(TaskInstance, ti_fields, row[: len(ti_fields)])
        definition = row[len(ti_fields) :]
        ti.definition = sql.instances(Task, task_fields, definition) if definition[0] is not None else None
        instances.append(ti)
    return instances


def advance_run_now(dag_run_id: int) -> None:
    """Move a run on right after a report or an operator action, instead of at the next pass.

    The change that called it is already saved; if this fails, the scheduler's next pass does
    the same work, so the failure is logged and never raised into the caller.
    """
    try:
        advance_run(dag_run_id)
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


def _states_by_task(instances: list[TaskInstance]) -> dict[str, list[str]]:
    """Each task's instances' states (one for a task that is not mapped)."""
    states: dict[str, list[str]] = {}
    for ti in instances:
        states.setdefault(ti.task_id, []).append(ti.state)
    return states


def _settle(instances: list[TaskInstance], states: dict[str, list[str]], now: datetime) -> None:
    """Decide the waiting tasks whose upstreams allow it: ready (scheduled), upstream_failed,
    skipped or removed; a mapped task that may run expands instead (`mapping.expand_ready`). A
    task removed from its DAG while it waited to run (scheduled, or up_for_retry) is removed too,
    not dispatched to fail for want of a definition and spend the user's retries. One statement
    per kind of decision; settling one task can decide its downstream, so it repeats (in memory)
    until nothing changes."""
    while True:
        decided: dict[TaskState, list[TaskInstance]] = {}
        for ti in instances:
            if ti.state == TaskState.NONE or (ti.definition is None and ti.state in WAITING_TO_RUN_STATES):
                target = _settled_state(ti, states)
                if target is not None:
                    decided.setdefault(target, []).append(ti)
        if not decided:
            return
        changed = False
        for ti in [ti for ti in decided.get(TaskState.SCHEDULED, []) if is_unexpanded(ti)]:
            decided[TaskState.SCHEDULED].remove(ti)
            changed |= _expand(ti, instances, now)
        for target, tis in decided.items():
            if not tis:
                continue
            changes: dict[str, Any] = {"state": target}
            if target != TaskState.SCHEDULED:
                changes["end_date"] = now
            won = transition_many([(ti.pk, ti.attempt_token, ti.state) for ti in tis], **changes)
            for ti in tis:
                if ti.pk in won:
                    ti.state = target
                    changed = True
                    if target in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED):
                        lifecycle.task_finished(ti, now)  # a removed task's deadlines end with its run
        if not changed:
            return
        states.clear()
        states.update(_states_by_task(instances))


def _expand(ti: TaskInstance, instances: list[TaskInstance], now: datetime) -> bool:
    """Expand a mapped task that may run; its new instances join the run's, ready to dispatch."""
    expanded = expand_ready(ti, now)
    if expanded is None:
        return False  # another process expanded it: its next pass reads the instances
    _, ready = expanded
    for created in ready[1:]:
        created.dag_run, created.definition = ti.dag_run, ti.definition
        instances.append(created)
    return True


def _settled_state(ti: TaskInstance, states: dict[str, list[str]]) -> TaskState | None:
    """What a waiting task becomes now, or None while it must wait. A mapped upstream counts
    with every one of its instances."""
    if ti.definition is None:
        return TaskState.REMOVED
    upstream_states = [state for u in ti.definition.upstream for state in states.get(u, [TaskState.REMOVED])]
    verdict = readiness(ti.definition.trigger_rule, upstream_states)
    if verdict is Readiness.WAIT:
        return None
    return {
        Readiness.RUN: TaskState.SCHEDULED,
        Readiness.UPSTREAM_FAILED: TaskState.UPSTREAM_FAILED,
        Readiness.SKIPPED: TaskState.SKIPPED,
    }[verdict]


def _finish_if_done(run: DagRun, task_states: Iterable[str], now: datetime) -> bool:
    """End the run if every task is done. `task_states` may be a little stale: a task that
    finished since is seen by its worker's own advance_run(), which waits for our lock."""
    outcome = run_outcome(task_states)
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
