"""A wait begins: what the dispatch needs of waits, below the reports and runs that end them.

A ready `wait_for` task goes to no worker and holds no slot: `split` tells it from the tasks to
dispatch, `begin` starts its wait (its one attempt, its wait row, `up_for_reschedule`), fenced
as a dispatch is. Checking and ending waits is `waits.py`, above the reports it makes.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction

from deadlines import lifecycle
from orchestrator.data.taskconfig import args_for
from orchestrator.engine.graph import graph_of
from orchestrator.engine.transitions import transition
from orchestrator.models import DagRun, TaskAttempt, TaskInstance, TaskWait
from retries.policy import wait_timeout_at
from retries.states import WAITS_WITHOUT_CHECKS, AttemptKind, TaskState, WaitFor, WaitKind


def waiting_for(kind: str, since: datetime, next_check_at: datetime | None) -> dict[str, Any]:
    """The run document's `waiting_for` of a waiting task (an event or approval shows no next check)."""
    shown = None if kind in WAITS_WITHOUT_CHECKS else next_check_at
    return {"kind": WaitKind.WAIT.value, "name": kind, "since": since.isoformat(), "next_check_at": shown.isoformat() if shown else None}


def wait_kind(wait_for: dict[str, Any] | None) -> tuple[str, Any] | None:
    """A task's `wait_for` as (kind, its spec); None for a task that runs a process."""
    if not wait_for:
        return None
    ((kind, spec),) = wait_for.items()
    return kind, spec


def wait_tasks(run: DagRun) -> frozenset[str]:
    """The ids of the run's wait_for tasks, told by the DAG's graph, read once per version of the DAG."""
    return graph_of(run.dag_id, run.dag.updated_at).wait_tasks


def split(run: DagRun, due: list[TaskInstance]) -> tuple[list[TaskInstance], list[TaskInstance]]:
    """`due` as (tasks to dispatch to a worker, wait_for tasks whose wait is to begin). Told by
    the DAG's graph (`wait_tasks`): a DAG without waits costs nothing."""
    waits = wait_tasks(run)
    if not waits or not due:
        return due, []
    return [ti for ti in due if ti.task_id not in waits], [ti for ti in due if ti.task_id in waits]


def begin(tis: Iterable[TaskInstance], now: datetime, *, unwritten: frozenset[int] = frozenset()) -> int:
    """Begin the wait of each of these ready wait_for tasks: no worker, no slot. Its new attempt
    (the one row of the whole wait, `running` from now to the wait's end) and its wait row are
    written with the move to `up_for_reschedule`, fenced as a dispatch is; the first check is
    due at once. Returns how many began."""
    begun = 0
    for ti in tis:
        definition = ti.definition
        kind_spec = wait_kind(definition.wait_for if definition is not None else None)
        if kind_spec is None:
            continue
        kind, spec = kind_spec
        args = args_for(ti)
        token = ti.attempt_token + 1
        try_number = ti.try_number if ti.retry_is_platform else ti.try_number + 1
        checked = kind not in WAITS_WITHOUT_CHECKS
        timeout_at = wait_timeout_at(now, float(args["wait_timeout"]))
        next_check_at = now if checked else timeout_at
        with transaction.atomic():
            won = transition(
                ti.pk,
                expected=[TaskState.NONE if ti.pk in unwritten else ti.state],
                token=ti.attempt_token,
                state=TaskState.UP_FOR_RESCHEDULE,
                attempt_token=token,
                try_number=try_number,
                retry_is_platform=False,
                pre_execution_tries=0,
                queued_at=now,
                start_date=now,
                end_date=None,
                next_retry_at=None,
                release_at=None,
                waiting_for=waiting_for(kind, now, next_check_at),
            )
            if not won:
                continue
            TaskAttempt.objects.create(
                task_instance_id=ti.pk,
                attempt_token=token,
                try_number=try_number,
                infrastructure_try_number=ti.infrastructure_try_number,
                kind=AttemptKind.USER,
                state=TaskAttempt.State.RUNNING,
                queued_at=now,
                start_date=now,
                item=ti.map_item if ti.map_index >= 0 else None,
            )
            TaskWait.objects.update_or_create(
                task_instance_id=ti.pk,
                defaults={
                    "kind": kind,
                    "spec": spec if isinstance(spec, dict) else {"value": spec},
                    "event_name": str(spec.get("name", "")) if kind == WaitFor.EVENT and isinstance(spec, dict) else "",
                    "attempt_token": token,
                    "since": now,
                    "timeout_at": timeout_at,
                    "next_check_at": next_check_at,
                    "poke_interval": float(args["poke_interval"]),
                    "checks": 0,
                    "last_check": None,
                },
            )
            ti.state, ti.attempt_token, ti.try_number = TaskState.UP_FOR_RESCHEDULE, token, try_number
            lifecycle.task_queued(ti, now)
            lifecycle.task_started(ti, now)
        begun += 1
    return begun
