"""What a worker (or the scheduler, for what no worker can report) tells the database.

Every function takes the attempt token it was dispatched with; a report for an attempt
that is no longer current changes nothing and returns False/None.
"""

from __future__ import annotations

import functools
import json
import logging
import random
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection, transaction

from deadlines import lifecycle
from orchestrator import listeners
from orchestrator.data import metrics, sql
from orchestrator.data.taskconfig import AttemptArgs, args_for, attempt_args, merge_args, platform_settings, retry_args
from orchestrator.engine import handover, upstream
from orchestrator.engine.circuits import attempt_ended
from orchestrator.engine.failure_counts import count as count_failure
from orchestrator.engine.graph import graph_of
from orchestrator.engine.run_advance import advance_after_report, advance_run_now
from orchestrator.engine.run_reads import (
    CROWDED,
    NEAR_THE_END,
    UNFINISHED,
    UNFINISHED_PROBE,
    downstream_may_settle,
    fewest_open_upstreams,
    run_is_over,
)
from orchestrator.engine.transitions import transition, transition_sql
from orchestrator.foundation.clock import Now, shared_now
from orchestrator.foundation.run_params import task_params
from orchestrator.listeners import notify
from orchestrator.models import Dag, DagRun, Task, TaskAttempt, TaskInstance
from retries.context import ExecutionContext
from retries.memory import MemoryArgs, after_failure
from retries.policy import Budget, Decision, decide
from retries.states import (
    CLAIM_FROM,
    HEARTBEAT_FROM,
    MARK_RUNNING_FROM,
    REPORT_FAILURE_FROM,
    REPORT_SUCCESS_FROM,
    AttemptKind,
    Reason,
    TaskState,
)

log = logging.getLogger(__name__)

_rng = random.SystemRandom()


@dataclass(frozen=True)
class WorkerInfo:
    hostname: str
    worker_name: str
    pid: int | None = None


def load(task_instance_id: int) -> TaskInstance | None:
    return (
        TaskInstance.objects.select_related("dag_run", "dag_run__dag", "definition").filter(pk=task_instance_id).first()
    )


def _move_attempt(
    task_instance_id: int,
    token: int,
    expected: frozenset[TaskState],
    task_changes: dict[str, Any],
    attempt_changes: dict[str, Any],
) -> bool:
    """Change the task (fenced by state and token) and its current attempt row together.

    Returns False when the report lost (stale or duplicate). On PostgreSQL it is one statement
    (the attempt's UPDATE in a WITH clause), atomic by itself; elsewhere it is two, and the
    caller runs them in a transaction (`_atomic_move`), so the two rows never disagree.
    """
    return _move_attempt_then(task_instance_id, token, expected, task_changes, attempt_changes) is not None


def _move_attempt_then(
    task_instance_id: int,
    token: int,
    expected: frozenset[TaskState],
    task_changes: dict[str, Any],
    attempt_changes: dict[str, Any],
    then: tuple[str, list[Any], list[Any]] | None = None,
) -> list[tuple] | None:
    """`_move_attempt`, then the query `then` (its SQL, parameters and fields, as `sql.fetch`
    takes them) if the move won: its rows, or None when the move lost. On PostgreSQL the query
    is part of the move's statement (it sees the rows as they were before the move)."""
    statement = transition_sql(task_instance_id, expected=expected, token=token, changes=task_changes)
    if statement is None:
        return None
    task_sql, params = statement
    assigned, attempt_params = sql.assignments(TaskAttempt, attempt_changes)
    attempt_sql = f"UPDATE {TaskAttempt._meta.db_table} SET {assigned} WHERE task_instance_id = %s AND attempt_token = %s"
    attempt_params += [task_instance_id, token]
    if connection.vendor == "postgresql":
        # Prepared: every row it touches is found by a unique key (`sql.cursor`).
        moves = f"WITH moved AS ({task_sql} RETURNING id), attempt AS ({attempt_sql} AND EXISTS (SELECT 1 FROM moved))"
        if then is None:
            ((moved,),) = sql.fetch(f"{moves} SELECT count(*) FROM moved", params + attempt_params, [None], prepare=True)
            return [] if moved == 1 else None
        query, query_params, fields = then
        rows = sql.fetch(f"{moves} {query} AND EXISTS (SELECT 1 FROM moved)", params + attempt_params + query_params, fields, prepare=True)
        return rows or None
    if sql.execute(task_sql, params) != 1:
        return None
    sql.execute(attempt_sql, attempt_params)
    if then is None:
        return []
    query, query_params, fields = then
    return sql.fetch(query, query_params, fields)


def _atomic_move() -> Any:
    """The transaction `_move_attempt` needs: none on PostgreSQL, where it is one statement."""
    return nullcontext() if connection.vendor == "postgresql" else transaction.atomic()


@dataclass(frozen=True)
class Claimed:
    """What a worker needs to run the attempt it claimed, read in one query."""

    pk: int
    task_id: str
    attempt_token: int
    try_number: int
    infrastructure_try_number: int
    dag_id: str
    run_id: str
    logical_date: datetime
    conf: dict[str, Any]
    args: AttemptArgs  # what the supervisor enforces, from the effective arguments (system, DAG, task)
    has_definition: bool  # False: the task was removed from its DAG
    python_callable: str | None
    bash_command: str | None
    op_kwargs: dict[str, Any]
    map_index: int = -1
    # A mapped instance's item, by the name its task's `expand` gives it; empty otherwise.
    mapped: dict[str, Any] = field(default_factory=dict)
    # Each direct upstream's result (a mapped upstream's: its instances' results in order), as
    # the JSON text of an object by task id: the task process decodes it (`engine/upstream.py`).
    results_json: str = "{}"
    queue: str = "default"  # what the claim's gate checks (engine/claimgate.py)
    circuit: str | None = None
    # Read with the claim, so that starting the task reads nothing else when there is nothing:
    task_state_epoch: int = 0
    has_task_state: bool = False  # some task state is stored (to read for the task)
    has_start_deadlines: bool = True  # task_started_at deadlines to create with the handshake
    # The run's declared params (context["params"]): its conf's values, defaults filled.
    params: dict[str, Any] = field(default_factory=dict)
    # MiB: the attempt's memory limit (the task's own, or what memory_limit_exceeded stepped it
    # up to); None: no limit.
    memory_limit_mib: int | None = None

    @property
    def results(self) -> dict[str, Any]:
        """`results_json`, decoded (a bash command's template reads it in the worker)."""
        return json.loads(self.results_json)


_CLAIM_SQL = """
SELECT ti.task_id, ti.attempt_token, ti.try_number, ti.infrastructure_try_number, ti.definition_id,
       r.run_id, r.logical_date, r.conf, d.dag_id, d.default_args,
       t.python_callable, t.bash_command, t.op_kwargs, t.args,
       ti.map_index, ti.map_item, ti.dag_run_id, t.upstream, t.expand, ti.queue, ti.circuit,
       ti.task_state_epoch, EXISTS (SELECT 1 FROM orchestrator_taskstateentry e WHERE e.task_instance_id = ti.id),
       {start_deadlines}, d.params, ti.memory_limit_mib
FROM orchestrator_taskinstance ti
JOIN orchestrator_dagrun r ON r.id = ti.dag_run_id
JOIN orchestrator_dag d ON d.id = r.dag_id
LEFT JOIN orchestrator_task t ON t.id = ti.definition_id
WHERE ti.id = %s
"""


def _claim_fields() -> list:
    ti, run, dag, task = (model._meta.get_field for model in (TaskInstance, DagRun, Dag, Task))
    return [ti("task_id"), ti("attempt_token"), ti("try_number"), ti("infrastructure_try_number"), None,
            run("run_id"), run("logical_date"), run("conf"), dag("dag_id"), dag("default_args"),
            task("python_callable"), task("bash_command"), task("op_kwargs"), task("args"),
            ti("map_index"), ti("map_item"), None, task("upstream"), task("expand"), ti("queue"), ti("circuit"),
            ti("task_state_epoch"), None, None, dag("params"), ti("memory_limit_mib")]


def claim(task_instance_id: int, token: int, worker: WorkerInfo) -> Claimed | None:
    """A worker took the job: record who holds it if the dispatch is still current, and return
    what the attempt runs; None if the dispatch is no longer current."""
    # In a transaction even where the move is one statement: a worker killed while its claim
    # waits on a lock never commits it, and its job is found as never claimed.
    with transaction.atomic():
        return claim_within(task_instance_id, token, worker)


def claim_within(
    task_instance_id: int, token: int, worker: WorkerInfo, *, known_results: dict[str, Any] | None = None
) -> Claimed | None:
    """`claim`, in the caller's transaction: a report's dispatch claims the task it hands to the
    reporting worker's slot (`engine/handover.py`), knowing the result the report recorded
    (`known_results`)."""
    holder = {"hostname": worker.hostname, "worker_name": worker.worker_name, "pid": worker.pid}
    start_deadlines, deadline_params = lifecycle.start_deadlines_exist_sql("ti")
    what_it_runs = (_CLAIM_SQL.format(start_deadlines=start_deadlines), [*deadline_params, task_instance_id], _claim_fields())
    rows = _move_attempt_then(task_instance_id, token, CLAIM_FROM, {**holder, "heartbeat_at": Now()}, holder, then=what_it_runs)
    if rows is None:
        return None
    (row,) = rows
    (task_id, attempt_token, try_number, infrastructure_try_number, definition_id, run_id, logical_date, conf,
     dag_id, default_args, python_callable, bash_command, op_kwargs, task_args,
     map_index, map_item, dag_run_id, upstream_ids, expand, queue, circuit,
     task_state_epoch, has_task_state, has_start_deadlines, declared_params, memory_limit_mib) = row
    results = upstream.results_json(dag_run_id, upstream_ids, known_results) if upstream_ids else "{}"
    mapped = {name: map_item for name in expand} if expand and map_index >= 0 else {}
    args = merge_args(default_args, task_args)
    return Claimed(
        pk=task_instance_id,
        task_id=task_id,
        attempt_token=attempt_token,
        try_number=try_number,
        infrastructure_try_number=infrastructure_try_number,
        dag_id=dag_id,
        run_id=run_id,
        logical_date=logical_date,
        conf=conf or {},
        args=attempt_args(args),
        has_definition=definition_id is not None,
        python_callable=python_callable,
        bash_command=bash_command,
        op_kwargs=op_kwargs or {},
        map_index=map_index,
        mapped=mapped,
        results_json=results,
        queue=queue,
        circuit=circuit,
        task_state_epoch=task_state_epoch,
        has_task_state=bool(has_task_state),
        has_start_deadlines=bool(has_start_deadlines),
        params=task_params(declared_params, conf),
        memory_limit_mib=memory_limit_mib if memory_limit_mib is not None else MemoryArgs.of(args).memory_limit,
    )


def mark_running(
    task_instance_id: int, token: int, *, pid: int | None = None, now: datetime | None = None, has_start_deadlines: bool | None = None
) -> bool:
    """The task process's "running" handshake: from here on it is no pre-execution failure.

    `has_start_deadlines`, when the claim read it, spares the handshake that read."""
    now = now or shared_now()
    # A deadline exists exactly when the state change that creates it does: same transaction.
    # Without one, the move alone is the handshake: on PostgreSQL one statement, committed as it
    # runs (no BEGIN and COMMIT round trips on the way to the task's first line). (And like a
    # claim, a handshake commits only if its worker is alive to commit it: the task of a worker
    # killed meanwhile never ran its user code, and is found as such.)
    has_deadlines = lifecycle.has_start_deadlines(task_instance_id) if has_start_deadlines is None else has_start_deadlines
    with transaction.atomic() if has_deadlines else _atomic_move():
        moved = _move_attempt(
            task_instance_id,
            token,
            MARK_RUNNING_FROM,
            {"state": TaskState.RUNNING, "start_date": now, "end_date": None, "heartbeat_at": Now(), "pid": pid},
            {"state": TaskAttempt.State.RUNNING, "start_date": now, "pid": pid},
        )
        if not moved:
            return False
        if has_deadlines:
            lifecycle.task_started_by_id(task_instance_id, now)
    if listeners.wanted("on_task_instance_running"):
        notify("on_task_instance_running", task_instance=load(task_instance_id))
    return True


def record_pid(task_instance_id: int, token: int, pid: int) -> bool:
    """A command started directly, after its handshake was recorded: which process it is."""
    with _atomic_move():
        return _move_attempt(task_instance_id, token, frozenset({TaskState.RUNNING}), {"pid": pid}, {"pid": pid})


def holds_claim(task_instance_id: int, token: int, worker: WorkerInfo) -> bool:
    """Whether `worker` holds the claim of this attempt and has not started it (a claim whose
    commit it did not hear of: `handover.Offer.unheard`)."""
    return TaskInstance.objects.filter(
        pk=task_instance_id, attempt_token=token, state__in=CLAIM_FROM, worker_name=worker.worker_name, hostname=worker.hostname
    ).exists()


def heartbeat(task_instance_id: int, token: int) -> bool:
    """False means the attempt was superseded: the supervisor must kill its task at once."""
    return transition(
        task_instance_id,
        expected=HEARTBEAT_FROM,
        token=token,
        heartbeat_at=Now(),
    )


def operator_stop(task_instance_id: int, token: int) -> ExecutionContext | None:
    """Why an operator took this attempt from its worker (mark failed), or None if nobody did."""
    context = (
        TaskInstance.objects.filter(pk=task_instance_id, attempt_token=token, state=TaskState.FAILED)
        .values_list("last_failure_context", flat=True)
        .first()
    )
    if not context or context.get("reason") != Reason.MANUAL_MARK_FAILED:
        return None
    return ExecutionContext.from_dict(context)


def heartbeat_many(attempts: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """One heartbeat for all of a worker's attempts: one fenced statement per HEARTBEAT_CHUNK
    attempts (row values against VALUES: one OR term per attempt exceeded SQLite's expression
    depth at about a thousand); returns the (task_instance_id, token) pairs that were refused
    (superseded)."""
    refused: set[tuple[int, int]] = set()
    states = [str(s) for s in HEARTBEAT_FROM]
    in_state = f"state IN ({sql.placeholders(len(states))})"
    for start in range(0, len(attempts), HEARTBEAT_CHUNK):
        chunk = attempts[start : start + HEARTBEAT_CHUNK]
        current = f"(id, attempt_token) IN (VALUES {', '.join(['(%s, %s)'] * len(chunk))})"
        params = [value for attempt in chunk for value in attempt]
        where = f"{current} AND {in_state}"
        if connection.vendor == "postgresql":
            # A row another transaction holds (this worker's own report of it, or a scheduler
            # presuming it lost) is skipped, not waited for: one busy row must not stop the
            # heartbeat of every other attempt. Whoever holds it decides that attempt's fate.
            where = f"id IN (SELECT id FROM orchestrator_taskinstance WHERE {where} FOR UPDATE SKIP LOCKED)"
        if sql.execute(
            f"UPDATE orchestrator_taskinstance SET heartbeat_at = {sql.now_sql()} WHERE {where}",
            params + states,
        ) == len(chunk):
            continue
        still = set(
            sql.fetch(
                f"SELECT id, attempt_token FROM orchestrator_taskinstance WHERE {current} AND {in_state}",
                params + states,
                [None, None],
            )
        )
        refused.update(attempt for attempt in chunk if attempt not in still)
    return refused


# Attempts per heartbeat statement: two bound parameters each, well under SQLite's limit.
HEARTBEAT_CHUNK = 500


def report_success(
    task_instance_id: int,
    token: int,
    *,
    result: Any = None,
    stdout: str = "",
    stderr: str = "",
    output_truncated: bool = False,
    now: datetime | None = None,
    memory_limit_mib: int | None = None,
    peak_memory_mib: int | None = None,
    expected: frozenset[TaskState] = REPORT_SUCCESS_FROM,
) -> bool:
    """A worker's success, or (from `up_for_reschedule`) a wait met: `engine/waits.py`."""
    now = now or shared_now()
    ended = _Ended.read(task_instance_id)
    # Most successes (a wide fan-out's tasks) change nothing else: then the report is the move alone.
    open_upstreams = _open_upstreams_downstream(ended)
    moves_run = ended.unfinished_others == 0 or open_upstreams == 0
    offer = handover.wanted()
    if offer is not None and ended.map_index < 0:
        offer.ended(ended.task_id, result)

    def record(advance: bool) -> bool:
        with transaction.atomic() if ended.has_deadlines or moves_run else _atomic_move():
            moved = _move_attempt(
                task_instance_id,
                token,
                expected,
                # The result is written by the same fenced move as the success: a late report of a
                # superseded attempt loses the fence and never overwrites a newer attempt's result.
                {"state": TaskState.SUCCESS, "end_date": now, "next_retry_at": None, "heartbeat_at": None, "result": result},
                {
                    "state": TaskAttempt.State.SUCCESS,
                    "end_date": now,
                    "result": result,
                    "stdout": stdout,
                    "stderr": stderr,
                    "output_truncated": output_truncated,
                    **_memory_of_attempt(memory_limit_mib, peak_memory_mib),
                },
            )
            if not moved:
                return False
            if ended.has_deadlines:
                lifecycle.task_finished(task_instance_id, now)
            if moves_run and advance:
                # Its row is locked by the move: a task that is not mapped is its run's only
                # instance of that task, and it is `success` now.
                states = [str(TaskState.SUCCESS)] if ended.map_index < 0 else None
                _advance_within(ended.dag_run_id, now, ended=ended.task_id, ended_states=states)
        return True

    if not _with_advance_or_alone(record):
        return False
    if not moves_run and (
        (ended.unfinished_others < NEAR_THE_END and run_is_over(ended.dag_run_id))
        or (open_upstreams < CROWDED and downstream_may_settle(ended.dag_run_id, graph_of(ended.dag_pk, ended.dag_version), ended.task_id))
    ):
        # The tasks that end last each read the others unfinished before they recorded their
        # own end; whichever looks again last, after its own commit, sees them all ended.
        advance_run_now(ended.dag_run_id, ended=ended.task_id)
    if listeners.wanted("on_task_instance_success"):
        notify("on_task_instance_success", task_instance=load(task_instance_id))
    attempt_ended(ended.circuit)  # its circuit may close (or open) on this attempt
    return True


_ENDED_READ = f"""
    SELECT ti.task_id, ti.dag_run_id, r.dag_id, d.updated_at, ti.circuit,
           EXISTS (SELECT 1 FROM deadlines_deadline dl WHERE dl.task_instance_id = ti.id),
           (SELECT count(*) FROM (SELECT 1 FROM orchestrator_taskinstance o WHERE o.dag_run_id = ti.dag_run_id
                   AND o.id <> ti.id AND o.state IN ({sql.literals(UNFINISHED)})
                   ORDER BY o.task_id LIMIT {NEAR_THE_END}) AS others),
           ti.map_index
    FROM orchestrator_taskinstance ti
    JOIN orchestrator_dagrun r ON r.id = ti.dag_run_id
    JOIN orchestrator_dag d ON d.id = r.dag_id
    WHERE ti.id = %s
"""


@dataclass(frozen=True)
class _Ended:
    """What a success report reads about its task, in one query before it records the end
    (none of it changes with the end)."""

    pk: int
    task_id: str
    dag_run_id: int
    dag_pk: int
    dag_version: datetime
    circuit: str | None
    has_deadlines: bool
    unfinished_others: int  # other tasks of the run not finished yet, counted up to NEAR_THE_END
    map_index: int = -1

    @classmethod
    def read(cls, task_instance_id: int) -> _Ended:
        ti, dag = functools.partial(sql.column_field, TaskInstance), functools.partial(sql.column_field, Dag)
        ((task_id, dag_run_id, dag_pk, dag_version, circuit, has_deadlines, unfinished_others, map_index),) = sql.fetch(
            _ENDED_READ,
            [task_instance_id],
            [ti("task_id"), None, None, dag("updated_at"), ti("circuit"), None, None, None],
            # Planning it took the server longer than running it. Its one parameter is the key:
            # the states and the bound are written in, so that a plan made once for any task
            # still finds the run's unfinished tasks by their partial index.
            prepare=True,
        )
        return cls(
            task_instance_id, task_id, dag_run_id, dag_pk, dag_version, circuit, bool(has_deadlines), unfinished_others, map_index
        )


def _open_upstreams_downstream(ended: _Ended) -> int:
    """Whether this task's end can change anything in its run: 0 when a task downstream of it
    may be settled (`run_reads.fewest_open_upstreams`), else how many upstreams its downstream tasks
    still wait for as far as seen (UNFINISHED_PROBE: none). A wide fan-out's tasks change nothing
    until the last one ends, and locking and reading the whole run for each of them made their
    reports queue behind each other. (Two last tasks ending at once may each read the other
    open: see `run_reads.run_is_over` and CROWDED.)"""
    if ended.unfinished_others == 0 or not _has_downstream(ended):
        return UNFINISHED_PROBE
    return fewest_open_upstreams(ended.dag_run_id, graph_of(ended.dag_pk, ended.dag_version), ended.task_id)


def _has_downstream(ended: _Ended) -> bool:
    return ended.task_id in _upstream_task_ids(ended.dag_pk, ended.dag_version)


def _upstream_task_ids(dag_pk: int, version: datetime) -> frozenset[str]:
    """The tasks of a DAG some other task waits for, read once per version of the DAG (an edit
    that misses the version only delays a downstream task to the next scheduler pass)."""
    return graph_of(dag_pk, version).upstream_task_ids


def _advance_within(dag_run_id: int, now: datetime, *, ended: str, ended_states: list[str] | None = None) -> None:
    """Dispatch the run's ready tasks in the report's own transaction: one commit for both, and
    no scheduler pass on the way from one task to the next. Without a savepoint of its own (two
    round trips on every report's way): if it fails, `_AdvanceFailed` rolls back the whole
    transaction and `_with_advance_or_alone` records the report alone."""
    try:
        advance_after_report(dag_run_id, ended, now, ended_states=ended_states, savepoint=False)
    except Exception as exc:
        raise _AdvanceFailed(dag_run_id) from exc


class _AdvanceFailed(Exception):
    """Moving the run on with a report failed: the report's transaction is rolled back."""


R = TypeVar("R")


def _with_advance_or_alone(record: Callable[[bool], R]) -> R:
    """`record(True)`: the report and its run's advance in one transaction. If the advance fails,
    that transaction is rolled back whole and `record(False)` records the report alone; the next
    scheduler pass moves the run on."""
    try:
        return record(True)
    except _AdvanceFailed as failed:
        log.error("could not advance run %s with the report; the next scheduler pass will", failed.args[0], exc_info=failed.__cause__)
        return record(False)


def report_failure(
    task_instance_id: int,
    token: int,
    context: ExecutionContext,
    *,
    fingerprint: str | None = None,
    retry_after: float | None = None,
    error: BaseException | str | None = None,
    stdout: str = "",
    stderr: str = "",
    output_truncated: bool = False,
    expected: frozenset[TaskState] = REPORT_FAILURE_FROM,
    now: datetime | None = None,
    memory_limit_mib: int | None = None,
    peak_memory_mib: int | None = None,
) -> Decision | None:
    """Charge a failed attempt to the right budget and move the task on; None if the report is
    stale. A memory_limit_exceeded steps up the limit (and may change the queue) of the task's
    later attempts."""
    now = now or shared_now()
    ti = load(task_instance_id)
    if ti is None or ti.attempt_token != token or ti.state not in expected:
        return None
    decision = decide_for(ti, context, fingerprint=fingerprint, retry_after=retry_after, now=now)
    previous_state = ti.state
    if memory_limit_mib is None and previous_state == TaskState.RUNNING:
        # A report its worker did not make (the worker was lost): the attempt ran all the same,
        # with the limit its claim gave it.
        memory_limit_mib = current_memory_limit(ti)
    later = _later_attempts(ti, context)

    def record(advance: bool) -> TaskInstance | None:
        with transaction.atomic():
            moved = _move_attempt(
                task_instance_id,
                token,
                frozenset({TaskState(previous_state)}),
                dict(
                    state=decision.next_state,
                    next_retry_at=decision.next_retry_at,
                    infrastructure_try_number=decision.infrastructure_try_number,
                    pre_execution_tries=decision.pre_execution_tries,
                    retry_is_platform=decision.is_platform_retry,
                    failure_fingerprint=decision.fingerprint,
                    fingerprint_streak=decision.fingerprint_streak,
                    last_failure_context={**decision.task_context.to_dict(), "at": now.isoformat()},
                    end_date=now,
                    heartbeat_at=None,
                    **later,
                ),
                dict(
                    state=TaskAttempt.State.FAILED,
                    end_date=now,
                    kind=decision.kind,
                    context=decision.attempt_context.to_dict(),
                    fingerprint=decision.attempt_fingerprint,
                    stdout=stdout,
                    stderr=stderr,
                    output_truncated=output_truncated,
                    **_memory_of_attempt(memory_limit_mib, peak_memory_mib),
                ),
            )
            if not moved:
                return None
            count_failure(task_instance_id, token)
            moved_ti = load(task_instance_id)
            assert moved_ti is not None  # the update above holds its row until the commit
            if decision.next_state is TaskState.FAILED:
                lifecycle.task_finished(moved_ti, now)
            # The apps that asked (the alerts app's rules) record it in this transaction: an
            # event commits with its failure or not at all. Sending is never ours.
            listeners.failure_recorded(
                moved_ti,
                decision.attempt_context,
                fingerprint=decision.attempt_fingerprint,
                error=error,
                dead_lettered=decision.task_context if decision.next_state is TaskState.DEAD_LETTER else None,
                at=now,
            )
            retry_due_now = decision.next_retry_at is not None and decision.next_retry_at <= now
            if advance and (decision.next_state is TaskState.FAILED or retry_due_now):
                _advance_within(moved_ti.dag_run_id, now, ended=moved_ti.task_id)
        return moved_ti

    recorded = _with_advance_or_alone(record)
    if recorded is None:
        return None
    ti = recorded
    _after_failure(ti, previous_state, decision, error)
    return decision


def _memory_of_attempt(limit: int | None, peak: int | None) -> dict[str, int]:
    """The attempt row's memory columns, as far as the report knows them (a report made by the
    scheduler, of a lost worker, knows only the limit)."""
    known = {"memory_limit_mib": limit, "peak_memory_mib": peak}
    return {name: value for name, value in known.items() if value is not None}


def _later_attempts(ti: TaskInstance, context: ExecutionContext) -> dict[str, Any]:
    """What a failure changes for the task's later attempts (retries/memory.py): after a
    memory_limit_exceeded, their limit, and their queue when it has a queue_on_oom."""
    if context.reason is not Reason.MEMORY_LIMIT_EXCEEDED:
        return {}
    after = after_failure(context.reason, current_memory_limit(ti), ti.queue, MemoryArgs.of(args_for(ti)))
    return {"memory_limit_mib": after.memory_limit_mib, "queue": after.queue}


def current_memory_limit(ti: TaskInstance) -> int | None:
    """The memory limit (MiB) of the task's current attempt: stepped up after a
    memory_limit_exceeded, else its `memory_limit`."""
    return ti.memory_limit_mib if ti.memory_limit_mib is not None else MemoryArgs.of(args_for(ti)).memory_limit


def budget_of(ti: TaskInstance) -> Budget:
    """The counters of a task instance that the budget rules read."""
    return Budget(
        try_number=ti.try_number,
        max_tries=ti.max_tries,
        infrastructure_try_number=ti.infrastructure_try_number,
        pre_execution_tries=ti.pre_execution_tries,
        last_fingerprint=ti.failure_fingerprint,
        fingerprint_streak=ti.fingerprint_streak,
    )


def decide_for(
    ti: TaskInstance,
    context: ExecutionContext,
    *,
    fingerprint: str | None,
    retry_after: float | None,
    now: datetime,
) -> Decision:
    args = args_for(ti)
    args["infrastructure_retry_limit"] = ti.infrastructure_retry_limit
    budget = budget_of(ti)
    return decide(
        context,
        budget,
        retry_args(args),
        platform_settings(),
        now=now,
        rng=_rng,
        fingerprint=fingerprint,
        retry_after=retry_after,
    )


def _after_failure(
    ti: TaskInstance, previous_state: str, decision: Decision, error: BaseException | str | None
) -> None:
    dag_id = ti.dag_run.dag.dag_id
    attempt_context = decision.attempt_context
    metrics.increment(
        metrics.TASK_FAILURES,
        dag_id=dag_id,
        task_id=ti.task_id,
        category=attempt_context.category.value,
        reason=attempt_context.reason.value,
    )
    if decision.kind is AttemptKind.PLATFORM:
        metrics.increment(
            metrics.INFRASTRUCTURE_RETRIES, dag_id=dag_id, task_id=ti.task_id, reason=attempt_context.reason.value
        )
    log.info(
        "task %s.%s run %s attempt failed: %s/%s (%s budget) -> %s",
        dag_id,
        ti.task_id,
        ti.dag_run.run_id,
        attempt_context.category,
        attempt_context.reason,
        decision.kind,
        decision.next_state,
    )
    notify(
        "on_task_instance_failed",
        previous_state=previous_state,
        task_instance=ti,
        error=error,
        execution_context=attempt_context,
    )
    if decision.next_state is TaskState.DEAD_LETTER:
        notify("on_task_instance_dead_lettered", task_instance=ti, execution_context=decision.task_context)
    attempt_ended(ti.circuit)  # its circuit may open on this attempt
