"""Pools and limits with real workers and two schedulers: the tasks themselves never see more
running at once than the limit allows."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from orchestrator.engine.run_creation import create_run
from orchestrator.models import Dag, DagRun, Pool, Task
from tests.conftest import wait_until
from tests.limits.tasks import max_overlap, read_intervals

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

SCHEDULER = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.1"}


def _runs(dag: Dag, count: int) -> list[DagRun]:
    base = timezone.now()
    return [
        create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=base + timedelta(seconds=i), now=base + timedelta(seconds=i))
        for i in range(count)
    ]


def _all_done(runs: list[DagRun]) -> bool:
    return all(DagRun.objects.get(pk=run.pk).state == "success" for run in runs)


def test_pool_and_limits_hold_with_two_schedulers_and_many_worker_slots(spawn, worker, make_dag, tmp_path: Path):
    Pool.objects.create(name="warehouse", slots=3)
    pooled, limited, per_task = tmp_path / "pooled.log", tmp_path / "limited.log", tmp_path / "per_task.log"
    pool_dag = make_dag(
        [
            {"task_id": f"load{i}", "python_callable": "tests.limits.tasks.record", "op_kwargs": {"path": str(pooled), "seconds": 0.3}, "args": {"pool": "warehouse"}}
            for i in range(4)
        ]
    )
    pool_dag.max_active_runs = 10
    pool_dag.save()
    limit_dag = make_dag(
        [
            *[
                {"task_id": f"t{i}", "python_callable": "tests.limits.tasks.record", "op_kwargs": {"path": str(limited), "seconds": 0.3}}
                for i in range(3)
            ],
            {"task_id": "single", "python_callable": "tests.limits.tasks.record", "op_kwargs": {"path": str(per_task), "seconds": 0.3}, "args": {"max_active_tis_per_dag": 1}},
        ]
    )
    limit_dag.max_active_runs = 10
    limit_dag.max_active_tasks = 2
    limit_dag.save()
    runs = _runs(pool_dag, 3) + _runs(limit_dag, 3)
    # Ten worker slots, two schedulers: only the limits stand between the tasks and running at once.
    worker(ORCHESTRATOR_WORKER_CONCURRENCY=5)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY=5)
    spawn("run_scheduler", env=SCHEDULER)
    spawn("run_scheduler", env=SCHEDULER)
    wait_until(lambda: _all_done(runs), timeout=90, interval=0.2, message="every run to succeed")
    pooled_runs, limited_runs = read_intervals(str(pooled)), read_intervals(str(limited)) + read_intervals(str(per_task))
    assert len(pooled_runs) == 12
    assert len(limited_runs) == 12
    assert max_overlap(pooled_runs) == 3  # full, never over
    assert max_overlap(limited_runs) <= 2
    assert max_overlap(read_intervals(str(per_task))) == 1


def test_max_active_runs_holds_with_two_schedulers(spawn):
    dag = Dag.objects.create(dag_id="one-at-a-time", max_active_runs=1, default_args={"queue": "nobody-listens"})
    Task.objects.create(dag=dag, task_id="wait", python_callable="tests.worker.tasks.succeed")  # keeps its run running
    _runs(dag, 20)
    first, second = spawn("run_scheduler", "--once"), spawn("run_scheduler", "--once")
    for proc in (first, second):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    assert DagRun.objects.filter(dag=dag, state="running").count() == 1
    assert DagRun.objects.filter(dag=dag, state="queued").count() == 19
