"""The first seed's scenario: retries=3, a platform budget of 5, and four physical attempts.

Attempt one dies because its worker is killed, attempt two because something SIGKILLs the task
(as the OOM killer would), attempt three raises DataProcessingError, attempt four succeeds.
The user sees user try 2 of 4 and platform retries 2 of 5, with every attempt explained.
"""
from __future__ import annotations

import json
import os
import signal

import pytest

from orchestrator.data import metrics
from orchestrator.models import TaskInstance
from tests.conftest import wait_until
from tests.worker.conftest import instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_it_spends_the_platform_budget_on_the_platforms_failures(worker, make_dag, tmp_path, settings, monkeypatch):
    """The run succeeds on user try 2 of 4 after two platform retries; every attempt says why."""
    marker, listener_log = tmp_path / "attempts.jsonl", tmp_path / "listener.jsonl"
    monkeypatch.setenv("SCENARIO_LISTENER_LOG", str(listener_log))
    settings.ORCHESTRATOR_LISTENERS = ["tests.scenarios.tasks"]
    env = {"ORCHESTRATOR_LISTENERS": "tests.scenarios.tasks", "SCENARIO_LISTENER_LOG": str(listener_log)}
    first_worker = worker(**env)
    dag = make_dag(
        [{"task_id": "process_data", "python_callable": "tests.scenarios.tasks.process_data", "op_kwargs": {"marker": str(marker)}}],
        retries=3,
        infrastructure_retry_limit=5,
    )
    before = {tuple(sorted(k.items())): v for k, v in metrics.read(metrics.TASK_FAILURES)}
    run = trigger(dag)

    # 1. The worker running the task is killed outright; its task process dies with it.
    settle(run, "process_data", ("running",))
    wait_until(lambda: len(_records(marker)) == 1, message="the first attempt to start")
    first_task_pid = _records(marker)[0]["pid"]
    os.kill(first_worker.pid, signal.SIGKILL)
    first_worker.wait(timeout=10)
    wait_until(lambda: not _alive(first_task_pid), timeout=10, message="the orphaned task process to die")
    worker(**env)

    # 2. Something else SIGKILLs the task process, as the OOM killer would.
    wait_until(lambda: (settle(run, "process_data", ("running", "queued", "scheduled")) and len(_records(marker)) == 2), timeout=30,
               message="the second attempt to start")
    os.kill(_records(marker)[1]["pid"], signal.SIGKILL)

    # 3. and 4. DataProcessingError, then success.
    settle(run, "process_data", ("success", "failed", "dead_letter"), timeout=30)
    run.refresh_from_db()
    wait_until(lambda: (run.refresh_from_db() or run.state) == "success", message="the run to succeed")

    ti: TaskInstance = instance(run, "process_data")
    assert (ti.try_number, ti.max_tries) == (2, 4)
    assert (ti.infrastructure_try_number, ti.infrastructure_retry_limit) == (2, 5)
    attempts = list(ti.attempts.order_by("attempt_token"))
    summary = [(a.kind, a.state, a.try_number, a.infrastructure_try_number, (a.context or {}).get("reason")) for a in attempts]
    assert summary == [
        ("platform", "failed", 1, 0, "worker_lost"),
        ("platform", "failed", 1, 1, "resource_exhaustion"),
        ("user", "failed", 1, 2, "task_exception"),
        ("user", "success", 2, 2, None),
    ]
    lost, oom, error, _ = attempts
    assert lost.context["source"] == "scheduler"
    assert lost.context["metadata"]["worker_name"]
    assert oom.context["source"] in ("worker", "executor")
    assert oom.context["metadata"].get("signal") in (9, "SIGKILL")
    assert error.context["category"] == "application"
    assert error.fingerprint
    assert len(error.fingerprint) == 12
    assert error.context["metadata"]["exception_type"].endswith("DataProcessingError")
    assert ti.last_failure_context["reason"] == "task_exception"  # kept after the success

    # The platform engineer's listener saw all three failures, from the scheduler and the worker.
    seen = [(r["category"], r["reason"]) for r in _records(listener_log)]
    assert seen == [("infrastructure", "worker_lost"), ("infrastructure", "resource_exhaustion"), ("application", "task_exception")]
    after = {tuple(sorted(k.items())): v for k, v in metrics.read(metrics.TASK_FAILURES)}
    for reason, category in (("worker_lost", "infrastructure"), ("resource_exhaustion", "infrastructure"), ("task_exception", "application")):
        key = (("category", category), ("dag_id", dag.dag_id), ("reason", reason), ("task_id", "process_data"))
        assert after[key] - before.get(key, 0) == 1
