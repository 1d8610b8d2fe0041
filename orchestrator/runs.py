"""Creating DAG runs and their task instances."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from deadlines import lifecycle
from orchestrator.models import Dag, DagRun, TaskInstance
from orchestrator.taskconfig import effective_args
from retries.states import RunState


class TriggerError(Exception):
    """A run cannot be created (unknown or paused DAG, bad conf)."""


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
) -> DagRun:
    """Insert the run and one task instance per task, in one transaction."""
    now = now or timezone.now()
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
        )
        instances = []
        for task in dag.tasks.all():
            task.dag = dag
            args = effective_args(task)
            instances.append(
                TaskInstance(
                    dag_run=run,
                    definition=task,
                    task_id=task.task_id,
                    max_tries=int(args["retries"]) + 1,
                    infrastructure_retry_limit=int(args["infrastructure_retry_limit"]),
                    queue=str(args["queue"]),
                )
            )
        TaskInstance.objects.bulk_create(instances)
        lifecycle.run_created(run, now)
    return run


def create_manual_run(
    dag: Dag, *, conf: dict[str, Any] | None = None, triggered_by: str = "", now: datetime | None = None
) -> DagRun:
    """A manual run: its logical date is its trigger time."""
    if dag.paused:
        raise TriggerError(f"DAG '{dag.dag_id}' is paused; unpause it to trigger a run")
    if conf is not None and not isinstance(conf, dict):
        raise TriggerError(f"conf must be a JSON object, got {type(conf).__name__}")
    now = now or timezone.now()
    run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now, conf=conf, now=now, triggered_by=triggered_by)
    # Start it at once instead of waiting for the next scheduler pass.
    from orchestrator.scheduler import advance_run

    transaction.on_commit(lambda: advance_run(run.pk))
    return run
