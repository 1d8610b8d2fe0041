"""Fixtures for the worker tests: real `run_worker` processes on a queue of the test's own,
and the scheduler's pass run in the test process while it waits."""
from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import Dag, DagRun, Task, TaskInstance
from tests.conftest import wait_until


@pytest.fixture
def queue_name() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def scheduler_settings(settings):
    """The scheduler passes this test runs: lost workers found after 2 s, platform retries at once."""
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT = 2
    settings.ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY = 0
    settings.ORCHESTRATOR_QUEUED_TIMEOUT = 600
    return settings


@pytest.fixture
def worker(spawn, queue_name, scheduler_settings) -> Callable[..., subprocess.Popen]:
    """Start `run_worker <queue>`; its log is printed when the test fails."""
    logs: list[tuple[int, list[str]]] = []

    def start(**env: Any) -> subprocess.Popen:
        merged = {"ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.2", **{k: str(v) for k, v in env.items()}}
        proc = spawn("run_worker", queue_name, env=merged)
        lines: list[str] = []
        logs.append((proc.pid, lines))
        proc.log_lines = lines  # type: ignore[attr-defined]  # what it logged so far
        # Drain its output so a chatty worker never blocks on a full pipe.
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        return proc

    yield start
    for pid, lines in logs:
        print(f"--- worker {pid} ---\n{''.join(lines)}")


@pytest.fixture
def make_dag(queue_name) -> Callable[..., Dag]:
    """A DAG on this test's queue: `make_dag([{"task_id": ..., ...}], retries=...)`."""

    def make(tasks: list[dict[str, Any]], **default_args: Any) -> Dag:
        dag = Dag.objects.create(
            dag_id=f"dag-{uuid.uuid4().hex[:8]}",
            default_args={"queue": queue_name, "retry_delay": 0.1, **default_args},
        )
        for position, spec in enumerate(tasks):
            Task.objects.create(dag=dag, position=position, **spec)
        return dag

    return make


def trigger(dag: Dag, conf: dict[str, Any] | None = None) -> DagRun:
    return create_manual_run(dag, conf=conf)


def instance(run: DagRun, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def settle(run: DagRun, task_id: str, states: tuple[str, ...], timeout: float = 20.0) -> TaskInstance:
    """Run scheduler passes until the task reaches one of `states`."""

    def reached() -> TaskInstance | None:
        schedule_once()
        ti = instance(run, task_id)
        return ti if ti.state in states else None

    return wait_until(reached, timeout=timeout, interval=0.05, message=f"{task_id} to reach {states}")


def running_pid(run: DagRun, task_id: str, timeout: float = 20.0) -> int:
    """The task process's pid once the task reported running (a bash command started directly
    is recorded running just before it starts, and its pid just after)."""
    ti = settle(run, task_id, ("running",), timeout=timeout)
    attempt = ti.attempts.get(attempt_token=ti.attempt_token)
    wait_until(lambda: attempt.refresh_from_db() or attempt.pid, timeout=5, message=f"the pid of {task_id}")
    return attempt.pid


def gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, waiting for a parent to collect it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:  # gone before the open, or between the open and the read (ESRCH)
        return True
