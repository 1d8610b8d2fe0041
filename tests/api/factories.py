"""Factories and engine helpers for the API and web tests.

Runs are created with orchestrator.engine.run_creation.create_run and failures are produced with the real
dispatch and reporting functions, so the rows look exactly like the ones workers leave.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import factory
from django.utils import timezone

from orchestrator.engine.dispatch import dispatch
from orchestrator.engine.reporting import (
    WorkerInfo,
    claim,
    mark_running,
    report_failure,
    report_success,
)
from orchestrator.engine.run_creation import create_run
from orchestrator.engine.transitions import transition
from orchestrator.models import Dag, DagRun, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source
from tests.engine import factories as base

WORKER = WorkerInfo(hostname="test-host", worker_name="test-worker", pid=4242)


class DagFactory(base.DagFactory):
    default_args = factory.LazyFunction(lambda: {"retries": 1, "retry_delay": 0.1, "retry_jitter": "none"})


class TaskFactory(base.TaskFactory):
    dag = factory.SubFactory(DagFactory)
    python_callable = "tests.api.factories.noop"
    bash_command = ""


def noop() -> None:
    """The callable of factory tasks (never run in these tests)."""


def chain_dag(dag_id: str = "etl", task_ids: tuple[str, ...] = ("extract", "transform", "load"), **default_args) -> Dag:
    """A DAG whose tasks run one after another."""
    dag = DagFactory(dag_id=dag_id, default_args={"retries": 1, "retry_delay": 0.1, "retry_jitter": "none", **default_args})
    previous: list[str] = []
    for task_id in task_ids:
        TaskFactory(dag=dag, task_id=task_id, upstream=previous)
        previous = [task_id]
    return dag


def make_run(dag: Dag, *, at: datetime | None = None, run_type: str = DagRun.RunType.MANUAL) -> DagRun:
    at = at or timezone.now()
    return create_run(dag, run_type=run_type, logical_date=at, now=at)


def instance(run: DagRun, task_id: str) -> TaskInstance:
    return TaskInstance.objects.select_related("dag_run", "dag_run__dag", "definition").get(dag_run=run, task_id=task_id)


def start(run: DagRun, task_id: str) -> TaskInstance:
    """Dispatch the task, let a worker claim it and report running."""
    ti = instance(run, task_id)
    if ti.state == "none":  # what the scheduler's settling does once the upstreams are done
        assert transition(ti.pk, expected=["none"], token=ti.attempt_token, state="scheduled")
        ti = instance(run, task_id)
    if ti.state != "queued":  # advance_run may have dispatched it already
        assert dispatch(ti, timezone.now()), f"could not dispatch {task_id} ({ti.state})"
        ti = instance(run, task_id)
    assert claim(ti.pk, ti.attempt_token, WORKER) is not None
    assert mark_running(ti.pk, ti.attempt_token, pid=WORKER.pid)
    return instance(run, task_id)


def fail(
    run: DagRun,
    task_id: str,
    reason: Reason = Reason.TASK_EXCEPTION,
    *,
    fingerprint: str | None = "4a7c1d9e02bb",
    stdout: str = "",
    stderr: str = "",
    **metadata,
) -> TaskInstance:
    """Run one attempt of the task to a failure reported the way a worker reports it."""
    ti = start(run, task_id)
    metadata.setdefault("exception_type", "ValueError")
    context = ExecutionContext.of(reason, Source.WORKER, **metadata)
    decision = report_failure(ti.pk, ti.attempt_token, context, fingerprint=fingerprint, stdout=stdout, stderr=stderr)
    assert decision is not None
    return instance(run, task_id)


def fail_until_failed(run: DagRun, task_id: str, **kwargs) -> TaskInstance:
    """Fail user attempts until the task is out of retries."""
    ti = instance(run, task_id)
    for _ in range(ti.max_tries + 1):
        ti = fail(run, task_id, **kwargs)
        if ti.state == "failed":
            return ti
        _make_due(ti)
    raise AssertionError(f"{task_id} did not fail: {ti.state}")


def succeed(run: DagRun, task_id: str) -> TaskInstance:
    ti = start(run, task_id)
    assert report_success(ti.pk, ti.attempt_token, stdout="done\n")
    return instance(run, task_id)


def _make_due(ti: TaskInstance) -> None:
    TaskInstance.objects.filter(pk=ti.pk).update(next_retry_at=timezone.now() - timedelta(seconds=1))
