"""The RQ job the dispatcher enqueues: `run_task_instance(task_instance_id, token)`.

It claims the attempt (dropping the job if the attempt is no longer current), supervises the
task process, classifies what it saw and reports it, fenced by the attempt token throughout.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError

from orchestrator.engine import reporting
from orchestrator.engine.reporting import WorkerInfo
from orchestrator.engine.taskconfig import args_for
from orchestrator.models import TaskInstance
from orchestrator.worker import failpoints
from orchestrator.worker.classify import Outcome, Stop, Verdict, classify
from orchestrator.worker.rqworker import WorkerRuntime, default_worker_name, runtime
from orchestrator.worker.shutdown import SHUTDOWN
from orchestrator.worker.supervisor import Limits, Plan, Supervised, Supervisor
from retries.states import Reason

log = logging.getLogger(__name__)

# Reporting waits out a database blip this many times (about 15 seconds in all).
REPORT_ATTEMPTS = 6

T = TypeVar("T")


def run_task_instance(task_instance_id: int, token: int) -> str:
    """Run one attempt of a task instance; returns what happened, for RQ's job result."""
    shared = runtime()
    if shared is None:
        raise RuntimeError("run_task_instance runs only in a worker started by run_worker")
    worker = worker_info()
    ti = _with_db_retries(lambda: shared.db.call(reporting.claim, task_instance_id, token, worker))
    if ti is None:
        log.info("dropping job for task instance %s attempt %s: the attempt is no longer current", task_instance_id, token)
        return "stale"
    failpoints.fire(failpoints.WORKER_BEFORE_SPAWN, task_instance_id=ti.pk, task_id=ti.task_id)
    if SHUTDOWN.requested:
        # Stopping: start nothing new; another worker takes it on the platform budget.
        outcome = Outcome(handshake=False, stop=Stop(Reason.WORKER_TERMINATION, shutdown_signal=SHUTDOWN.signal), metadata=_metadata(worker))
        return _report(shared, ti.pk, token, classify(outcome), Supervised(superseded=False, outcome=outcome))
    if ti.definition is None:
        outcome = Outcome(started=False, start_error="the task was removed from its DAG", metadata=_metadata(worker))
        return _report(shared, ti.pk, token, classify(outcome), Supervised(superseded=False, outcome=outcome))
    supervisor = Supervisor(
        plan_for(ti),
        worker,
        limits(),
        launcher=shared.launcher,
        heartbeats=shared.heartbeats,
        db=shared.db.call,
        passthrough=tuple(settings.ORCHESTRATOR_TASK_ENV_PASSTHROUGH),
    )
    supervised = supervisor.run()
    if supervised.superseded:
        log.warning("task instance %s attempt %s was superseded; nothing reported", ti.pk, token)
        return "superseded"
    return _report(shared, ti.pk, token, classify(supervised.outcome), supervised)


def worker_info() -> WorkerInfo:
    shared = runtime()
    return WorkerInfo(hostname=socket.gethostname(), worker_name=shared.name if shared else default_worker_name(), pid=os.getpid())


def limits() -> Limits:
    return Limits(
        heartbeat_interval=float(settings.ORCHESTRATOR_HEARTBEAT_INTERVAL),
        heartbeat_timeout=float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT),
        shutdown_grace=float(settings.ORCHESTRATOR_WORKER_SHUTDOWN_GRACE),
        startup_timeout=float(settings.ORCHESTRATOR_HANDSHAKE_TIMEOUT),
        head_bytes=int(settings.ORCHESTRATOR_LOG_HEAD_BYTES),
        tail_bytes=int(settings.ORCHESTRATOR_LOG_TAIL_BYTES),
    )


def plan_for(ti: TaskInstance) -> Plan:
    task = ti.definition
    run = ti.dag_run
    dag = run.dag
    args = args_for(ti)
    timeout = args.get("execution_timeout")
    context = {
        "dag_id": dag.dag_id,
        "task_id": ti.task_id,
        "run_id": run.run_id,
        "try_number": ti.try_number,
        "infrastructure_try_number": ti.infrastructure_try_number,
        "logical_date": run.logical_date.isoformat(),
        "conf": run.conf or {},
    }
    payload = {
        "task_instance_id": ti.pk,
        "token": ti.attempt_token,
        "task_id": ti.task_id,
        "python_callable": task.python_callable,
        "bash_command": task.bash_command,
        "op_kwargs": task.op_kwargs or {},
        "context": context,
    }
    return Plan(
        task_instance_id=ti.pk,
        token=ti.attempt_token,
        task_id=ti.task_id,
        payload=payload,
        is_bash=bool(task.bash_command),
        execution_timeout=float(timeout) if timeout not in (None, "") else None,
        kill_grace=float(args["kill_grace"]),
    )


def _report(shared: WorkerRuntime, task_instance_id: int, token: int, verdict: Verdict, supervised: Supervised) -> str:
    output = dict(stdout=supervised.stdout, stderr=supervised.stderr, output_truncated=supervised.output_truncated)
    if verdict.success:
        won = _with_db_retries(lambda: shared.db.call(reporting.report_success, task_instance_id, token, result=verdict.result, **output))
        return "success" if won else "stale"
    assert verdict.context is not None
    decision = _with_db_retries(
        lambda: shared.db.call(
            reporting.report_failure,
            task_instance_id,
            token,
            verdict.context,
            fingerprint=verdict.fingerprint,
            retry_after=verdict.retry_after,
            error=verdict.error,
            expected=verdict.expected,
            **output,
        )
    )
    if decision is None:
        return "stale"
    return f"{verdict.context.category.value}/{verdict.context.reason.value} -> {decision.next_state.value}"


def _metadata(worker: WorkerInfo) -> dict[str, str]:
    return {"worker_name": worker.worker_name, "hostname": worker.hostname}


def _with_db_retries(report: Callable[[], T]) -> T:
    """Report through a database blip: the outcome is worth more than a few seconds' wait."""
    delay = 0.5
    for attempt in range(REPORT_ATTEMPTS):
        try:
            return report()
        except (OperationalError, InterfaceError):
            if attempt == REPORT_ATTEMPTS - 1:
                raise
            log.warning("could not report; retrying in %.1fs", delay, exc_info=True)
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
    raise AssertionError("unreachable")
