"""Mapped tasks under load and under faults, through real workers and schedulers: 200 instances
over two workers of 16 slots with one instance retrying alone; kill -9 of a worker mid-map; two
schedulers racing to expand."""
from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from orchestrator.engine.run_creation import create_run
from orchestrator.models import DagRun, TaskAttempt, TaskInstance
from tests.conftest import wait_until
from tests.faults.conftest import alive, scheduler_process, settle_runs, task_processes  # noqa: F401
from tests.faults.invariants import assert_invariants
from tests.worker.conftest import trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.mapping.tasks."


def _mapped(records, count: int, seconds: float, **extra) -> list[dict]:
    return [
        {"task_id": "items", "python_callable": T + "files", "op_kwargs": {"count": count}},
        {"task_id": "load", "python_callable": T + "recorded_instance", "upstream": ["items"],
         "expand": {"item": "results.items"}, "op_kwargs": {"records": str(records), "seconds": seconds, **extra}},
        {"task_id": "collect", "python_callable": T + "collect", "upstream": ["load"]},
    ]


def _instances(run: DagRun) -> list[TaskInstance]:
    return list(TaskInstance.objects.filter(dag_run=run, task_id="load").order_by("map_index"))


@pytest.mark.timeout(600)
def test_200_instances_over_two_workers_with_one_instance_retrying_alone(worker, make_dag, tmp_path, settings):
    # 32 task processes on a small shared machine: no worker is presumed lost for being slow here.
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT = 30
    records = tmp_path / "records"
    dag = make_dag(_mapped(records, 200, 0.2, fail_index=123), retries=1)
    slow_machine = {"ORCHESTRATOR_HEARTBEAT_INTERVAL": "1", "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "30"}
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="16", **slow_machine)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="16", **slow_machine)
    (run,) = settle_runs([trigger(dag)], timeout=400)
    assert run.state == "success"
    instances = _instances(run)
    assert [ti.map_index for ti in instances] == list(range(200))
    assert [ti.result for ti in instances] == [{"item": f"file-{i}.csv", "map_index": i} for i in range(200)]
    # Only instance 123 spent a user try: it failed once and retried alone.
    user_failures = TaskAttempt.objects.filter(task_instance__in=instances, kind="user", state="failed")
    assert [a.task_instance.map_index for a in user_failures] == [123]
    assert [ti.try_number for ti in instances if ti.try_number != 1] == [2]
    workers = set(TaskAttempt.objects.filter(task_instance__in=instances).values_list("worker_name", flat=True))
    assert len(workers) == 2, workers  # spread over both workers
    collect = TaskInstance.objects.get(dag_run=run, task_id="collect")
    assert collect.result["results"]["load"] == [ti.result for ti in instances]
    assert_invariants([run], [records])


@pytest.mark.timeout(600)
def test_kill_9_of_a_worker_mid_map_loses_no_result_and_runs_no_instance_twice_at_once(worker, make_dag, tmp_path):
    records = tmp_path / "records"
    dag = make_dag(_mapped(records, 24, 2.0))
    doomed = worker(ORCHESTRATOR_WORKER_CONCURRENCY="6")
    run = trigger(dag)

    def running_on_doomed() -> bool:
        from orchestrator.engine.scheduler import schedule_once

        schedule_once()
        return TaskInstance.objects.filter(dag_run=run, task_id="load", state="running").count() >= 6

    wait_until(running_on_doomed, timeout=60, message="six instances running on the doomed worker")
    survivors_done = TaskInstance.objects.filter(dag_run=run, task_id="load", state="success").count()
    pids = task_processes(doomed.pid)
    os.kill(doomed.pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), timeout=10, message="the doomed worker's task processes gone")
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="8")
    (run,) = settle_runs([run], timeout=180)
    assert run.state == "success"
    instances = _instances(run)
    assert [ti.result for ti in instances] == [{"item": f"file-{i}.csv", "map_index": i} for i in range(24)]
    lost = [ti for ti in instances if ti.attempts.filter(context__reason="worker_lost").exists()]
    assert len(lost) >= 6 - survivors_done  # the killed ones ran again, charged to the platform
    assert_invariants([run], [records])


@pytest.mark.timeout(300)
def test_two_schedulers_never_expand_a_task_twice(make_dag, scheduler_process):  # noqa: F811
    dag = make_dag([{"task_id": "fan", "bash_command": "true", "expand": {"n": list(range(50))}}])
    dag.max_active_runs = 20
    dag.save()
    base = timezone.now()
    runs = [
        create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=base + timedelta(seconds=i), now=base)
        for i in range(12)
    ]
    # No worker: every instance stays queued, so each dispatch is still visible as one attempt.
    scheduler_process()
    scheduler_process()

    def all_expanded() -> bool:
        return TaskInstance.objects.filter(dag_run__in=runs, state="queued").count() == 12 * 50

    wait_until(all_expanded, timeout=90, interval=0.2, message="every run's task expanded and dispatched")
    for run in runs:
        instances = list(TaskInstance.objects.filter(dag_run=run).order_by("map_index"))
        assert [ti.map_index for ti in instances] == list(range(50))
        assert [ti.map_item for ti in instances] == list(range(50))
        assert {ti.attempts.count() for ti in instances} == {1}
