"""What no worker can report: stale heartbeats and vanished jobs, found by the scheduler."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from rq import Queue
from rq.registry import FailedJobRegistry

from orchestrator.engine import reporting, scheduler
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = reporting.WorkerInfo(hostname="h", worker_name="w", pid=1)


@pytest.fixture
def queue():
    q = Queue("default", connection=get_redis())
    q.empty()
    yield q
    q.empty()
    get_redis().delete(FailedJobRegistry(q.name, connection=get_redis()).key)  # what a test failed there


def _single_task_run():
    dag = DagFactory(default_args={"retries": 1})
    TaskFactory(dag=dag, task_id="only")
    run = create_manual_run(dag)
    return run, TaskInstance.objects.get(dag_run=run)


@override_settings(ORCHESTRATOR_HEARTBEAT_TIMEOUT=5, ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0)
def test_it_requeues_a_running_task_whose_heartbeat_stopped(queue):
    """worker_lost: charged to the platform, try_number kept, dispatched again with a new token."""
    run, ti = _single_task_run()
    reporting.claim(ti.pk, ti.attempt_token, WORKER)
    reporting.mark_running(ti.pk, ti.attempt_token)
    TaskInstance.objects.filter(pk=ti.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=6))
    report = schedule_once()
    assert report.lost == [f"{ti.pk}:worker_lost"]
    schedule_once()
    ti.refresh_from_db()
    assert (ti.state, ti.try_number, ti.infrastructure_try_number, ti.attempt_token) == ("queued", 1, 1, 2)
    first = ti.attempts.get(attempt_token=1)
    assert first.kind == "platform"
    assert first.context["reason"] == "worker_lost"
    assert first.context["source"] == "scheduler"
    assert first.context["metadata"]["worker_name"] == "w"


@override_settings(ORCHESTRATOR_HEARTBEAT_TIMEOUT=5, ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0)
def test_it_treats_a_claimed_task_whose_worker_died_before_running_as_pre_execution(queue):
    """Taken by a worker, never reported running, heartbeat gone: pre_execution_failure/worker_died."""
    run, ti = _single_task_run()
    reporting.claim(ti.pk, ti.attempt_token, WORKER)
    TaskInstance.objects.filter(pk=ti.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=6))
    schedule_once()
    ti.refresh_from_db()
    first = ti.attempts.get(attempt_token=1)
    assert first.kind == "platform"
    assert first.start_date is None
    assert first.context["reason"] == "pre_execution_failure"
    assert first.context["metadata"]["pre_execution_reason"] == "worker_died"
    assert ti.pre_execution_tries == 1
    assert ti.try_number == 1


@override_settings(ORCHESTRATOR_QUEUED_TIMEOUT=1, ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0)
def test_it_finds_tasks_whose_jobs_vanished_from_redis(queue):
    """Redis restarting empty loses no task: the queued task is requeued as queue_lost."""
    run, ti = _single_task_run()
    assert queue.count == 1
    queue.empty()  # as if Redis restarted with nothing
    schedule_once()
    assert TaskInstance.objects.get(pk=ti.pk).state == "queued"  # not yet past the timeout
    TaskInstance.objects.filter(pk=ti.pk).update(queued_at=timezone.now() - timedelta(seconds=2))
    schedule_once()
    schedule_once()
    ti.refresh_from_db()
    assert ti.state == "queued"
    assert ti.attempt_token == 2
    assert ti.try_number == 1
    assert ti.attempts.get(attempt_token=1).context["reason"] == "queue_lost"
    assert queue.job_ids == [f"ti-{ti.pk}-2"]


@override_settings(ORCHESTRATOR_QUEUED_TIMEOUT=1)
def test_it_leaves_queued_tasks_alone_while_their_job_waits(queue):
    """A job still in the queue behind busy workers is not lost, however long it waits."""
    run, ti = _single_task_run()
    TaskInstance.objects.filter(pk=ti.pk).update(queued_at=timezone.now() - timedelta(hours=1))
    assert schedule_once().lost == []
    assert TaskInstance.objects.get(pk=ti.pk).attempt_token == 1


@override_settings(ORCHESTRATOR_QUEUED_TIMEOUT=600, ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0)
@pytest.mark.parametrize("read_limit", [1000, 0], ids=["registry read", "large registry: waiting jobs looked up"])
def test_it_requeues_a_task_whose_job_failed_before_it_was_claimed_at_once(queue, monkeypatch, read_limit):
    """A job that ended in RQ without claiming its attempt (its worker could not reach the
    database) is a pre-execution failure at once, without waiting for the queued timeout."""
    monkeypatch.setattr(scheduler, "FAILED_READ_LIMIT", read_limit)
    run, ti = _single_task_run()
    job = queue.fetch_job(f"ti-{ti.pk}-1")
    # What RQ does with a job whose function raised: its queue's failed registry, its status.
    FailedJobRegistry(queue.name, connection=get_redis()).add(job, ttl=600)
    get_redis().hset(job.key, "status", "failed")
    schedule_once()
    ti.refresh_from_db()
    first = ti.attempts.get(attempt_token=1)
    assert (first.kind, first.context["reason"], first.context["metadata"]["job_status"]) == (
        "platform", "pre_execution_failure", "failed"
    )
    assert ti.state == "queued"
    assert ti.attempt_token == 2
