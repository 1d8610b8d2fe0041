"""Early warning: how long an unfinished run (or task) probably still needs.

The estimate is the critical path through the run's unfinished tasks (longest chain by
upstream links), each task costed at the median of its recent successful attempts. No
estimate is made unless every unfinished task has enough history: a guess would warn wrongly.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime

from deadlines.conf import int_setting
from orchestrator.data.taskconfig import merge_args
from orchestrator.models import Dag, DagRun, TaskAttempt, TaskInstance
from retries.budget import remaining_worst_case_seconds
from retries.states import FINISHED_TASK_STATES, TaskState

# --- pure rules ------------------------------------------------------------------------------


def critical_path_seconds(remaining: Mapping[str, float], upstream: Mapping[str, Sequence[str]]) -> float:
    """The longest chain of `remaining` costs, following upstream links among those tasks only."""
    finish: dict[str, float] = {}

    def finish_of(task_id: str, visiting: frozenset[str]) -> float:
        if task_id in finish:
            return finish[task_id]
        before = [
            finish_of(u, visiting | {task_id})
            for u in upstream.get(task_id, ())
            if u in remaining and u not in visiting and u != task_id  # a cycle cannot recurse forever
        ]
        finish[task_id] = remaining[task_id] + max(before, default=0.0)
        return finish[task_id]

    return max((finish_of(t, frozenset()) for t in remaining), default=0.0)


def task_remaining(
    state: str, typical: float, now: datetime, started_at: datetime | None = None, next_retry_at: datetime | None = None
) -> float:
    """Seconds a task probably still needs, given its typical (median) duration."""
    if state == TaskState.DEAD_LETTER:
        return math.inf  # nothing moves until an operator acts
    if state == TaskState.RUNNING and started_at is not None:
        return max(0.0, typical - (now - started_at).total_seconds())
    if state == TaskState.UP_FOR_RETRY and next_retry_at is not None:
        return typical + max(0.0, (next_retry_at - now).total_seconds())
    return typical


def typical_duration(durations: Sequence[float], min_samples: int) -> float | None:
    """The median of `durations`, or None with fewer than `min_samples` of them."""
    if len(durations) < max(min_samples, 1):
        return None
    return float(statistics.median(durations))


# --- from the database ---------------------------------------------------------------------


def typical_durations(dag_pk: int, task_ids: Sequence[str]) -> dict[str, float]:
    """Median seconds of each task's newest successful attempts (tasks with too little history are left out)."""
    window = int_setting("ORCHESTRATOR_DEADLINE_RISK_WINDOW")
    min_samples = int_setting("ORCHESTRATOR_DEADLINE_RISK_MIN_SAMPLES")
    typical: dict[str, float] = {}
    for task_id in task_ids:
        rows = (
            TaskAttempt.objects.filter(
                task_instance__dag_run__dag_id=dag_pk,
                task_instance__task_id=task_id,
                state=TaskAttempt.State.SUCCESS,
                start_date__isnull=False,
                end_date__isnull=False,
            )
            .order_by("-end_date")
            .values_list("start_date", "end_date")[:window]
        )
        # The query leaves out rows without both dates; the test says so to the type checker.
        durations = [(end - start).total_seconds() for start, end in rows if start is not None and end is not None]
        value = typical_duration(durations, min_samples)
        if value is not None:
            typical[task_id] = value
    return typical


def estimate_run(run: DagRun, now: datetime) -> float | None:
    """Seconds the run probably still needs, or None when the history is too thin to say."""
    open_tasks = [ti for ti in run.task_instances.select_related("definition") if ti.state not in FINISHED_TASK_STATES]
    if not open_tasks:
        return 0.0
    return _estimate(run.dag_id, open_tasks, now)


def estimate_task(ti: TaskInstance, dag_pk: int, now: datetime) -> float | None:
    """Seconds one task probably still needs (its upstreams are done once it has a deadline)."""
    if ti.state in FINISHED_TASK_STATES:
        return 0.0
    return _estimate(dag_pk, [ti], now)


def _estimate(dag_pk: int, open_tasks: list[TaskInstance], now: datetime) -> float | None:
    typical = typical_durations(dag_pk, [ti.task_id for ti in open_tasks if ti.state != TaskState.DEAD_LETTER])
    remaining: dict[str, float] = {}
    upstream: dict[str, list[str]] = {}
    for ti in open_tasks:
        if ti.state != TaskState.DEAD_LETTER and ti.task_id not in typical:
            return None
        remaining[ti.task_id] = task_remaining(ti.state, typical.get(ti.task_id, 0.0), now, ti.start_date, ti.next_retry_at)
        upstream[ti.task_id] = list(ti.definition.upstream) if ti.definition else []
    _cap_by_worst_case(dag_pk, open_tasks, remaining, now)
    return critical_path_seconds(remaining, upstream)


def _cap_by_worst_case(dag_pk: int, open_tasks: list[TaskInstance], remaining: dict[str, float], now: datetime) -> None:
    """A task can never need more than what its retry budget still allows (every try left at its
    execution_timeout, the longest backoff before each): where that is less than the history's
    estimate (a slow history, a task on its last try), it is the better estimate."""
    default_args = Dag.objects.filter(pk=dag_pk).values_list("default_args", flat=True).first() or {}
    for ti in open_tasks:
        if ti.state == TaskState.DEAD_LETTER or ti.task_id not in remaining:
            continue
        args = merge_args(default_args, ti.definition.args if ti.definition else {})
        if args.get("execution_timeout") is None:
            continue
        worst = remaining_worst_case_seconds(
            str(ti.state),
            try_number=ti.try_number,
            max_tries=ti.max_tries,
            execution_timeout=float(args["execution_timeout"]),
            retry_delay=float(args["retry_delay"]),
            backoff=str(args["retry_backoff"]),
            max_delay=float(args["retry_max_delay"]),
            running_for=(now - ti.start_date).total_seconds() if ti.state == TaskState.RUNNING and ti.start_date else 0.0,
            wait_left=(ti.next_retry_at - now).total_seconds() if ti.state == TaskState.UP_FOR_RETRY and ti.next_retry_at else 0.0,
        )
        remaining[ti.task_id] = min(remaining[ti.task_id], worst)
