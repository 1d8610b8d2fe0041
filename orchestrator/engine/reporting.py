"""What a worker (or the scheduler, for what no worker can report) tells the database.

Every function takes the attempt token it was dispatched with; a report for an attempt
that is no longer current changes nothing and returns False/None.
"""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from deadlines import lifecycle
from orchestrator import metrics
from orchestrator.engine.circuits import attempt_ended
from orchestrator.engine.clock import Now, shared_now
from orchestrator.engine.runs import advance_run
from orchestrator.engine.taskconfig import args_for, platform_settings, retry_args
from orchestrator.engine.transitions import transition
from orchestrator.listeners import notify
from orchestrator.models import Task, TaskAttempt, TaskInstance
from retries.context import ExecutionContext
from retries.policy import Budget, Decision, decide
from retries.states import (
    CLAIM_FROM,
    FINISHED_TASK_STATES,
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
) -> TaskInstance | None:
    """Change the task (fenced by state and token) and its current attempt row together.

    Returns the task instance as it is now, or None when the report lost (stale or duplicate).
    Call inside a transaction, so the two rows never disagree.
    """
    if not transition(task_instance_id, expected=expected, token=token, **task_changes):
        return None
    TaskAttempt.objects.filter(task_instance_id=task_instance_id, attempt_token=token).update(**attempt_changes)
    return load(task_instance_id)


def claim(task_instance_id: int, token: int, worker: WorkerInfo) -> TaskInstance | None:
    """A worker took the job: record who holds it if the dispatch is still current, else None."""
    holder = {"hostname": worker.hostname, "worker_name": worker.worker_name, "pid": worker.pid}
    with transaction.atomic():
        return _move_attempt(task_instance_id, token, CLAIM_FROM, {**holder, "heartbeat_at": Now()}, holder)


def mark_running(task_instance_id: int, token: int, *, pid: int | None = None, now: datetime | None = None) -> bool:
    """The task process's "running" handshake: from here on it is no pre-execution failure."""
    now = now or shared_now()
    with transaction.atomic():
        ti = _move_attempt(
            task_instance_id,
            token,
            MARK_RUNNING_FROM,
            {"state": TaskState.RUNNING, "start_date": now, "end_date": None, "heartbeat_at": Now(), "pid": pid},
            {"state": TaskAttempt.State.RUNNING, "start_date": now, "pid": pid},
        )
        if ti is None:
            return False
        lifecycle.task_started(ti, now)
    notify("on_task_instance_running", task_instance=ti)
    return True


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
    """One heartbeat for all of a worker's attempts: one fenced statement while every one is
    current; returns the (task_instance_id, token) pairs that were refused (superseded)."""
    if not attempts:
        return set()
    current = Q()
    for task_instance_id, token in attempts:
        current |= Q(pk=task_instance_id, attempt_token=token)
    rows = TaskInstance.objects.filter(current, state__in=[str(s) for s in HEARTBEAT_FROM])
    if rows.update(heartbeat_at=Now()) == len(attempts):
        return set()
    still = set(rows.values_list("pk", "attempt_token"))
    return {attempt for attempt in attempts if attempt not in still}


def report_success(
    task_instance_id: int,
    token: int,
    *,
    result: Any = None,
    stdout: str = "",
    stderr: str = "",
    output_truncated: bool = False,
    now: datetime | None = None,
) -> bool:
    now = now or shared_now()
    with transaction.atomic():
        ti = _move_attempt(
            task_instance_id,
            token,
            REPORT_SUCCESS_FROM,
            {"state": TaskState.SUCCESS, "end_date": now, "next_retry_at": None, "heartbeat_at": None},
            {
                "state": TaskAttempt.State.SUCCESS,
                "end_date": now,
                "result": result,
                "stdout": stdout,
                "stderr": stderr,
                "output_truncated": output_truncated,
            },
        )
        if ti is None:
            return False
        lifecycle.task_finished(ti, now)
        if _run_may_move_on(ti):
            _advance_within(ti.dag_run_id, now)
    notify("on_task_instance_success", task_instance=ti)
    attempt_ended(ti.pk)  # its circuit may close (or open) on this attempt
    return True


def _run_may_move_on(ti: TaskInstance) -> bool:
    """Whether this task's end can change anything in its run: a task downstream of it to settle,
    or the run to end. A wide fan-out's tasks have neither until the last one ends, and locking
    and reading the whole run for each of them made their reports queue behind each other.
    Two last tasks ending at once may each see the other open: the scheduler's next pass ends
    the run then."""
    dag = ti.dag_run.dag
    if ti.task_id in _upstream_task_ids(dag.pk, dag.updated_at):
        return True
    unfinished = TaskInstance.objects.filter(dag_run_id=ti.dag_run_id).exclude(pk=ti.pk).exclude(state__in=FINISHED_TASK_STATES)
    return not unfinished.exists()


@functools.lru_cache(maxsize=256)
def _upstream_task_ids(dag_pk: int, version: datetime) -> frozenset[str]:
    """The tasks of a DAG some other task waits for, read once per version of the DAG (an edit
    that misses the version only delays a downstream task to the next scheduler pass)."""
    upstreams = Task.objects.filter(dag_id=dag_pk).values_list("upstream", flat=True)
    return frozenset(name for upstream in upstreams for name in upstream or [])


def _advance_within(dag_run_id: int, now: datetime) -> None:
    """Dispatch the run's ready tasks in the report's own transaction: one commit for both, and
    no scheduler pass on the way from one task to the next. If moving the run on fails, its
    savepoint is rolled back, the report still commits and the next scheduler pass does it."""
    try:
        advance_run(dag_run_id, now)
    except Exception:
        log.exception("could not advance run %s with the report; the next scheduler pass will", dag_run_id)


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
) -> Decision | None:
    """Charge a failed attempt to the right budget and move the task on; None if the report is stale."""
    now = now or shared_now()
    ti = load(task_instance_id)
    if ti is None or ti.attempt_token != token or ti.state not in expected:
        return None
    decision = decide_for(ti, context, fingerprint=fingerprint, retry_after=retry_after, now=now)
    previous_state = ti.state
    with transaction.atomic():
        ti = _move_attempt(
            ti.pk,
            token,
            frozenset({previous_state}),
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
            ),
        )
        if ti is None:
            return None
        if decision.next_state is TaskState.FAILED:
            lifecycle.task_finished(ti, now)
        retry_due_now = decision.next_retry_at is not None and decision.next_retry_at <= now
        if decision.next_state is TaskState.FAILED or retry_due_now:
            _advance_within(ti.dag_run_id, now)
    _after_failure(ti, previous_state, decision, error)
    return decision


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
    attempt_ended(ti.pk)  # its circuit may open on this attempt
