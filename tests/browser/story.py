"""A DAG with a history worth diagnosing, made with the real dispatch and reporting functions:
runs that succeeded, one that spent a platform retry, one whose task failed out of its tries,
one with a poisoned (dead-lettered) task, and one still running."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from orchestrator.models import DagRun, TaskInstance
from retries.states import Reason
from tests.api.factories import chain_dag, fail, make_run, start, succeed

TASKS = ("extract", "transform", "load_ledger", "publish")
CONFIG_MISSING = "config file missing: /etc/settlement/ledger.yaml"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/settlement/load.py", line 41, in load_ledger\n'
    "    config = read_config(path)\n"
    f"FileNotFoundError: {CONFIG_MISSING}\n"
)


@dataclass
class Story:
    succeeded: DagRun
    platform_retry: DagRun
    failed: DagRun
    poisoned: DagRun
    running: DagRun


def _due(run: DagRun, task_id: str) -> None:
    TaskInstance.objects.filter(dag_run=run, task_id=task_id).update(next_retry_at=timezone.now() - timedelta(seconds=1))


def _succeed_all(run: DagRun, task_ids=TASKS) -> None:
    for task_id in task_ids:
        succeed(run, task_id)


def settlement_story() -> Story:
    dag = chain_dag("settlement", task_ids=TASKS, retries=2, poison_threshold=2)
    now = timezone.now()
    runs = [make_run(dag, at=now - timedelta(hours=8 - i)) for i in range(8)]
    for run in runs[:4]:
        _succeed_all(run)
    platform = runs[4]
    fail(platform, "extract", Reason.WORKER_LOST, fingerprint=None)
    _succeed_all(platform)
    failed = runs[5]
    succeed(failed, "extract")
    for row in (7, 8, 9):  # a different row each time: a different fingerprint, never poisoned
        ti = fail(failed, "transform", fingerprint=f"5be0{row}a1c3f9d", stderr=f"ValueError: row {row} has no account id\n", message=f"row {row} has no account id")
        if ti.state == "failed":
            break
        _due(failed, "transform")
    poisoned = runs[6]
    succeed(poisoned, "extract")
    succeed(poisoned, "transform")
    for attempt in range(2):  # the same error twice: poisoned, dead-lettered
        if attempt:
            _due(poisoned, "load_ledger")
        fail(poisoned, "load_ledger", fingerprint="9c41e07bd2aa", stderr=TRACEBACK, exception_type="FileNotFoundError", message=CONFIG_MISSING)
    running = runs[7]
    start(running, "extract")
    return Story(runs[3], platform, failed, poisoned, running)
