"""The JSON documents, built once and served by the CLI and the API alike."""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection

from deadlines.models import Deadline
from orchestrator.data import sql
from orchestrator.data.queue_listeners import listened_queues, unattended_wait
from orchestrator.engine.dispatch import first_attempt
from orchestrator.models import Dag, DagRun, TaskAttempt, TaskInstance, TaskStateEntry
from retries.states import HOLD_FROM, TaskState


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def attempt_document(attempt: TaskAttempt) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "try_number": attempt.try_number,
        "infrastructure_try_number": attempt.infrastructure_try_number,
        "kind": attempt.kind,
        "state": attempt.state,
        "queued_at": iso(attempt.queued_at),
        "start_date": iso(attempt.start_date),
        "end_date": iso(attempt.end_date),
        "context": attempt.context,
        "hostname": attempt.hostname,
        "worker_name": attempt.worker_name,
        "pid": attempt.pid,
        "result": attempt.result,
        "stdout": attempt.stdout,
        "stderr": attempt.stderr,
        "output_truncated": attempt.output_truncated,
        "resume": attempt.resume,  # what a resumable task decided on this attempt
        "item": attempt.item,  # a mapped instance's item this attempt ran with; null when not mapped
        "memory_limit_mib": attempt.memory_limit_mib,  # the limit it ran with; null: none
        "peak_memory_mib": attempt.peak_memory_mib,  # the most it was seen to use; null: not measured
    }
    if attempt.fingerprint:
        doc["fingerprint"] = attempt.fingerprint
    return doc


def waiting_for(ti: TaskInstance, listened: set[str] | None = None) -> dict[str, Any] | None:
    """What a task that is ready but held waits for: its hold, or for a task queued where no
    live worker listens (`listened`: the queues live workers read), that queue. A stale hold
    of a task that moved on is not shown."""
    if ti.state in HOLD_FROM or ti.state == TaskState.UP_FOR_RESCHEDULE:  # held, or waiting (engine/waits.py)
        return ti.waiting_for
    if ti.state == TaskState.QUEUED and ti.heartbeat_at is None:
        return unattended_wait(ti.queue, ti.queued_at, listened)
    return None


def task_instance_document(
    ti: TaskInstance,
    attempts: list[TaskAttempt],
    entries: list[TaskStateEntry],
    listened: set[str] | None = None,
    earlier: list[TaskAttempt] | None = None,
) -> dict[str, Any]:
    """`attempts` and `entries`: the instance's own, in their order. `earlier`: for an
    unexpanded mapped task's placeholder, the attempts of its parked former instances
    (`parked_attempts`), listed with its own, oldest first."""
    if earlier:
        attempts = sorted([*attempts, *earlier], key=lambda a: (a.queued_at, a.pk))
    return {
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "state": ti.state,
        "result": ti.result,
        "try_number": ti.try_number,
        "max_tries": ti.max_tries,
        "infrastructure_try_number": ti.infrastructure_try_number,
        "infrastructure_retry_limit": ti.infrastructure_retry_limit,
        "next_retry_at": iso(ti.next_retry_at),
        "queued_at": iso(ti.queued_at),
        "start_date": iso(ti.start_date),
        "end_date": iso(ti.end_date),
        "queue": ti.queue,
        "failure_fingerprint": ti.failure_fingerprint,
        "last_failure_context": ti.last_failure_context,
        "waiting_for": waiting_for(ti, listened),
        "attempts": [attempt_document(a) for a in attempts],
        # The task's own store, kept across its attempts.
        "task_state": {entry.key: entry.value for entry in entries},
    }


def in_task_order(instances: Iterable[TaskInstance]) -> list[TaskInstance]:
    """Task instances in the order their tasks were created, a mapped task's by map_index (its
    instances after the first are created when it expands, after the run's other tasks). The
    former instances of a task made unexpanded again, parked below -1, are no entries of the
    run: `parked_attempts` finds their history."""
    instances = [ti for ti in instances if ti.map_index >= -1]
    first: dict[str, int] = {}
    for ti in instances:
        first[ti.task_id] = min(first.get(ti.task_id, ti.pk), ti.pk)
    return sorted(instances, key=lambda ti: (first[ti.task_id], ti.map_index))


def deadline_documents(run: DagRun) -> list[dict[str, Any]]:
    fields = sql.concrete_fields(Deadline, _DEADLINE_COLUMNS)
    rows = sql.fetch(
        f"SELECT {sql.columns('d', fields)} FROM {Deadline._meta.db_table} d WHERE d.dag_run_id = %s ORDER BY d.need_by, d.id",
        [run.pk],
        fields,
    )
    return [{**dict(zip(_DEADLINE_COLUMNS, row)), "need_by": iso(row[_DEADLINE_COLUMNS.index("need_by")])} for row in rows]


_DEADLINE_COLUMNS = ("scope", "task_id", "reference", "need_by", "state", "callback_state")


def parked_attempts(instances: Iterable[TaskInstance], attempts: dict[int, list[TaskAttempt]]) -> dict[str, list[TaskAttempt]]:
    """By task id, the attempts (`attempts`, by task instance) of the parked former instances
    among `instances`: shown with the placeholder of their task while it is unexpanded."""
    found: dict[str, list[TaskAttempt]] = {}
    for ti in instances:
        if ti.map_index < -1:
            found.setdefault(ti.task_id, []).extend(attempts.get(ti.pk, []))
    return found


def run_document(run: DagRun, known: list[TaskInstance] | None = None) -> dict[str, Any]:
    """The run with its task instances, their attempts and task state, and its deadlines.
    `known`: its every task instance as the trigger that created and started it left them
    (`run_creation.ManualRun`), with no task state nor deadline, and no attempt but the one the
    dispatch of each queued task wrote: nothing is read."""
    if known is None:
        rows, has_entries, has_deadlines = _instances_of_run(run)
        attempts = _by_instance(_rows_of_run(TaskAttempt, _OF_RUN_INSTANCES, "t.task_instance_id, t.attempt_token", run))
    else:
        rows, has_entries, has_deadlines = known, False, False
        attempts = {ti.pk: [first_attempt(ti)] for ti in known if ti.state == TaskState.QUEUED}
    entries = _by_instance(_rows_of_run(TaskStateEntry, _OF_RUN_INSTANCES, f"t.task_instance_id, t.{_quote('key')}", run)) if has_entries else {}
    earlier = parked_attempts(rows, attempts)
    instances = in_task_order(rows)
    # Redis is asked which queues live workers read only when a task waits in a queue.
    queued = any(ti.state == TaskState.QUEUED for ti in instances)
    listened = listened_queues() if queued else None
    return {
        "dag_id": run.dag.dag_id,
        "run_id": run.run_id,
        "run_type": run.run_type,
        "backfill_id": run.backfill_id,
        "state": run.state,
        "conf": run.conf,
        "queued_at": iso(run.queued_at),
        "start_date": iso(run.start_date),
        "end_date": iso(run.end_date),
        "logical_date": iso(run.logical_date),
        "task_instances": [
            task_instance_document(
                ti, attempts.get(ti.pk, []), entries.get(ti.pk, []), listened, earlier.get(ti.task_id) if ti.map_index == -1 else None
            )
            for ti in instances
        ],
        "deadlines": deadline_documents(run) if has_deadlines else [],
    }


def _instances_of_run(run: DagRun) -> tuple[list[TaskInstance], bool, bool]:
    """The run's task instances, and whether it has any task state and any deadline: the read of
    either is left out when there is none (most runs), a round trip fewer each. Asked in the
    instances' read, each once (neither depends on the row); a run of no task is read whole."""
    fields = sql.concrete_fields(TaskInstance)
    table = TaskInstance._meta.db_table
    rows = sql.fetch(
        f"SELECT {sql.columns('t', fields)},"
        f" EXISTS (SELECT 1 FROM {TaskStateEntry._meta.db_table} e JOIN {table} i ON i.id = e.task_instance_id WHERE i.dag_run_id = %s),"
        f" EXISTS (SELECT 1 FROM {Deadline._meta.db_table} d WHERE d.dag_run_id = %s)"
        f" FROM {table} t WHERE t.dag_run_id = %s ORDER BY t.id",
        [run.pk, run.pk, run.pk],
        fields,
        prepare=True,  # by the run's key, for every document: planned once per connection
    )
    if not rows:
        return [], False, True
    build = sql.builder(TaskInstance, fields)
    return [build(row[: len(fields)]) for row in rows], bool(rows[0][-2]), bool(rows[0][-1])


# The document's reads are written SQL: compiling them as querysets (a prefetch each for the
# attempts and the task state) cost several times what the database takes to answer them.
_OF_RUN_INSTANCES = f"t.task_instance_id IN (SELECT ti.id FROM {TaskInstance._meta.db_table} ti WHERE ti.dag_run_id = %s)"

M = TypeVar("M", TaskInstance, TaskAttempt, TaskStateEntry)


def _rows_of_run(model: type[M], where: str, order_by: str, run: DagRun) -> list[M]:
    """Every column of `model`'s rows that `where` (with the run's id for its one parameter)
    selects, in the order of `order_by`, as model instances."""
    fields = sql.concrete_fields(model)
    rows = sql.fetch(
        f"SELECT {sql.columns('t', fields)} FROM {model._meta.db_table} t WHERE {where} ORDER BY {order_by}", [run.pk], fields, prepare=True
    )
    build = sql.builder(model, fields)
    return [build(row) for row in rows]


Owned = TypeVar("Owned", TaskAttempt, TaskStateEntry)


def _by_instance(rows: list[Owned]) -> dict[int, list[Owned]]:
    """Attempts or task state entries by the id of their task instance, in the order read."""
    found: dict[int, list[Owned]] = {}
    for row in rows:
        found.setdefault(row.task_instance_id, []).append(row)
    return found


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def run_summary(run: DagRun) -> dict[str, Any]:
    return {
        "dag_id": run.dag.dag_id,
        "run_id": run.run_id,
        "run_type": run.run_type,
        "backfill_id": run.backfill_id,
        "state": run.state,
        "queued_at": iso(run.queued_at),
        "start_date": iso(run.start_date),
        "end_date": iso(run.end_date),
        "logical_date": iso(run.logical_date),
    }


def dag_document(dag: Dag) -> dict[str, Any]:
    return {
        "dag_id": dag.dag_id,
        "description": dag.description,
        "schedule": dag.schedule or None,
        "timezone": dag.timezone,
        "paused": dag.paused,
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "owner": dag.owner or None,
        "next_run_logical_date": iso(dag.next_run_logical_date),
        "params": dag.params or {},
        "strict_params": dag.strict_params,
        "tasks": [
            {
                "task_id": t.task_id,
                "upstream": t.upstream,
                "trigger_rule": t.trigger_rule,
                "python_callable": t.python_callable or None,
                "bash_command": t.bash_command or None,
                "expand": t.expand,
            }
            for t in dag.tasks.all()
        ],
    }
