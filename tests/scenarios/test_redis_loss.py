"""Redis is a delivery mechanism, the database is the truth: a flushed Redis loses no task."""
from __future__ import annotations

import pytest

from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import DagRun, TaskInstance
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

FAST = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.1", "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.2", "ORCHESTRATOR_QUEUED_TIMEOUT": "1"}


def test_it_runs_every_queued_task_after_redis_is_flushed(spawn, make_dag):
    """Tasks queued while no worker runs survive losing every job: requeued as queue_lost on the platform budget."""
    dag = make_dag([{"task_id": f"t{i}", "bash_command": "echo done"} for i in range(3)])
    trigger = spawn("trigger_dag", dag.dag_id, env=FAST)
    out, _ = trigger.communicate(timeout=60)
    run = DagRun.objects.get(run_id=out.splitlines()[0])
    assert set(TaskInstance.objects.filter(dag_run=run).values_list("state", flat=True)) == {"queued"}

    # As if Redis restarted empty: every queue and job is gone (the test run's own keys stay).
    redis = get_redis()
    redis.delete(*redis.scan_iter("rq:*"))
    assert not list(redis.scan_iter("rq:*"))

    spawn("run_scheduler", env=FAST)
    spawn("run_worker", TaskInstance.objects.filter(dag_run=run).first().queue, env=FAST)
    wait_until(lambda: (run.refresh_from_db() or run.state) == "success", timeout=60, message="the run to succeed")
    for ti in TaskInstance.objects.filter(dag_run=run):
        assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)
        lost, done = ti.attempts.order_by("attempt_token")
        assert (lost.kind, lost.context["reason"], lost.start_date) == ("platform", "queue_lost", None)
        assert (done.kind, done.state, done.stdout.strip()) == ("user", "success", "done")
