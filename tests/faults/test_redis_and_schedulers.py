"""Redis restarted empty and unreachable for 10 s (a private redis-server of the test's own);
a scheduler killed with -9 mid-pass, again and again; two schedulers racing."""
from __future__ import annotations

import os
import random
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from orchestrator.engine.run_creation import create_run
from orchestrator.models import DagRun
from tests.conftest import wait_until
from tests.faults.conftest import T, settle_runs
from tests.faults.invariants import assert_invariants, attempts_of, read_records
from tests.worker.conftest import trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _recorded(task_id: str, records, seconds: float, upstream=(), **extra) -> dict:
    return {
        "task_id": task_id,
        "python_callable": T + "recorded",
        "op_kwargs": {"records": str(records), "seconds": seconds, **extra},
        "upstream": list(upstream),
    }


def test_redis_restarted_empty_with_tasks_queued_and_running(worker, make_dag, records, private_redis, settings):
    """One task running, two jobs waiting in Redis; Redis restarts empty. The running task's
    outcome still reaches the database; the two lost jobs are found queue_lost after the queued
    timeout and retried on the platform budget; the worker keeps serving the new Redis."""
    settings.ORCHESTRATOR_QUEUED_TIMEOUT = 2
    dag = make_dag([_recorded("t0", records, 3), _recorded("t1", records, 0), _recorded("t2", records, 0)])
    run = trigger(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="1", REDIS_URL=private_redis.url)
    wait_until(lambda: run.task_instances.filter(state="running").count() == 1, timeout=20, message="one running")
    running = run.task_instances.get(state="running").task_id
    private_redis.restart_empty()
    settle_runs([run], timeout=60)
    tis = {ti.task_id: ti for ti in run.task_instances.all()}
    assert {ti.state for ti in tis.values()} == {"success"}
    assert attempts_of(tis[running]) == [("user", "success", None, 1, 0)]
    for task_id, ti in tis.items():
        if task_id != running:
            assert attempts_of(ti) == [("platform", "failed", "queue_lost", 1, 0), ("user", "success", None, 1, 1)], task_id
    assert_invariants([run], [records])


def test_redis_unreachable_for_10_seconds(worker, make_dag, records, private_redis, settings):
    """Redis stops answering for 10 s (its server SIGSTOPped) while tasks run and more wait: every
    task still ends in success, nothing runs twice at once, and no user try is spent."""
    settings.ORCHESTRATOR_QUEUED_TIMEOUT = 30
    dag = make_dag([_recorded(f"t{i}", records, 4) for i in range(4)] + [_recorded("after", records, 0, upstream=["t0", "t1"])])
    run = trigger(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="2", REDIS_URL=private_redis.url)
    wait_until(lambda: run.task_instances.filter(state="running").count() == 2, timeout=20, message="two running")
    private_redis.pause()
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end:
            from orchestrator.engine.scheduler import schedule_once

            schedule_once()  # the scheduler keeps passing against an unanswering Redis
            time.sleep(0.2)
    finally:
        private_redis.resume()
    settle_runs([run], timeout=90)
    for ti in run.task_instances.all():
        assert ti.state == "success", (ti.task_id, attempts_of(ti))
        assert ti.try_number == 1, (ti.task_id, attempts_of(ti))
    assert_invariants([run], [records])


def _runs_without_dispatch(dag, count: int) -> list[DagRun]:
    """Runs created but not started: only a scheduler pass moves them on."""
    base = timezone.now()
    return [create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=base + timedelta(seconds=i)) for i in range(count)]


def test_scheduler_killed_mid_pass_again_and_again(worker, make_dag, records, scheduler_process):
    """Twelve runs of a small DAG whose tasks fail their first user try (so every retry needs a
    scheduler pass); a scheduler is killed with -9 at random moments five times, then one is
    left to finish. Every task succeeds at try 2, with one attempt per dispatch and no overlap."""
    rng = random.Random(7)
    dag = make_dag(
        [
            _recorded("a", records, 0, fail_user_tries=1),
            _recorded("b", records, 0.2, upstream=["a"], fail_user_tries=1),
            _recorded("c", records, 0, upstream=["a"]),
            _recorded("d", records, 0, upstream=["b", "c"]),
        ],
        retries=2,
        retry_delay=0.2,
        retry_jitter="none",
    )
    dag.max_active_runs = 100
    dag.save()
    runs = _runs_without_dispatch(dag, 12)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="6")
    env = {"ORCHESTRATOR_QUEUED_TIMEOUT": "3"}
    for _ in range(5):
        proc = scheduler_process(**env)
        time.sleep(rng.uniform(1.5, 3.0))  # it booted and is somewhere in a pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    scheduler_process(**env)
    settle_runs(runs, timeout=90, passes=False)
    for run in runs:
        assert run.state == "success"
        for ti in run.task_instances.all():
            expected_try = 2 if ti.task_id in ("a", "b") else 1
            assert (ti.state, ti.try_number) == ("success", expected_try), attempts_of(ti)
    assert_invariants(runs, [records])


def test_two_schedulers_racing(worker, make_dag, records, scheduler_process):
    """Two schedulers and two workers over fifteen runs of a fan-out/fan-in DAG with retries:
    every task is dispatched once per try, never runs twice at once, and every run succeeds."""
    tasks = [_recorded("root", records, 0, fail_user_tries=1)]
    tasks += [_recorded(f"fan{i}", records, 0.1, upstream=["root"], fail_user_tries=i % 2) for i in range(6)]
    tasks += [_recorded("join", records, 0, upstream=[f"fan{i}" for i in range(6)])]
    dag = make_dag(tasks, retries=1, retry_delay=0.1, retry_jitter="none")
    dag.max_active_runs = 100
    dag.save()
    runs = _runs_without_dispatch(dag, 15)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="6")
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="6")
    scheduler_process()
    scheduler_process()
    settle_runs(runs, timeout=120, passes=False)
    assert {run.state for run in runs} == {"success"}
    starts = [r for r in read_records([records]) if r["event"] == "start"]
    assert len(starts) == 15 * (1 + 1 + 6 + 3 + 1)  # root twice, every fan once plus the odd ones again, join once
    assert_invariants(runs, [records])
