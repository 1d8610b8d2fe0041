"""The lost-job look of a scheduler pass: what a job waiting its turn, a job a live worker is
slow to claim and a batch still being enqueued look like, and that none of them is lost."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from rq import Queue
from rq.utils import now as rq_now
from rq.utils import utcformat

from orchestrator.engine import enqueuing, scheduler
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue():
    q = Queue("default", connection=get_redis())
    q.empty()
    yield q
    q.empty()


def _queued_long_ago(width: int = 1) -> list[TaskInstance]:
    dag = DagFactory(default_args={"retries": 1})
    for i in range(width):
        TaskFactory(dag=dag, task_id=f"t{i}")
    run = create_manual_run(dag)
    TaskInstance.objects.filter(dag_run=run).update(queued_at=timezone.now() - timedelta(hours=1))
    return list(TaskInstance.objects.filter(dag_run=run).order_by("id"))


@override_settings(ORCHESTRATOR_QUEUED_TIMEOUT=1)
def test_a_long_backlog_costs_a_pass_a_bounded_look(queue, monkeypatch):
    """More overdue jobs than one pass looks at: none is lost, and RQ is asked about at most the
    pass's share of them."""
    monkeypatch.setattr(scheduler, "LOST_JOB_CHECKS_PER_PASS", 5)
    asked: list[int] = []
    details = scheduler._job_details
    monkeypatch.setattr(scheduler, "_job_details", lambda ids: asked.append(len(ids)) or details(ids))
    tis = _queued_long_ago(12)
    assert queue.count == 12
    for _ in range(3):
        assert schedule_once().lost == []
    assert asked == [5, 5, 5]
    assert all(ti.attempt_token == 1 for ti in TaskInstance.objects.filter(pk__in=[t.pk for t in tis]))


@override_settings(ORCHESTRATOR_QUEUED_TIMEOUT=1, ORCHESTRATOR_HEARTBEAT_TIMEOUT=1, ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0)
def test_a_job_taken_but_not_started_is_lost_only_after_a_heartbeat_timeout(queue):
    """Out of its queue yet `queued` (a worker stopped between its pop and RQ's `started`)."""
    (ti,) = _queued_long_ago()
    get_redis().lrem(queue.key, 0, ti.job_id)  # taken by a worker that then stopped
    scheduler._Absent.forget_all_but(set())
    assert schedule_once().lost == []  # may be a live worker's moment between pop and start
    time.sleep(1.2)
    assert schedule_once().lost == [f"{ti.pk}:queue_lost"]


@override_settings(ORCHESTRATOR_QUEUED_TIMEOUT=1, ORCHESTRATOR_HEARTBEAT_TIMEOUT=2, ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0)
def test_a_started_job_is_lost_only_when_its_worker_stopped_keeping_it(queue):
    (ti,) = _queued_long_ago()
    redis = get_redis()
    redis.lrem(queue.key, 0, ti.job_id)
    redis.hset(f"rq:job:{ti.job_id}", mapping={"status": "started", "last_heartbeat": utcformat(rq_now())})
    assert schedule_once().lost == []  # a live worker, slow to claim: kept
    stale = rq_now() - timedelta(seconds=10)
    redis.hset(f"rq:job:{ti.job_id}", "last_heartbeat", utcformat(stale))
    assert schedule_once().lost == [f"{ti.pk}:pre_execution_failure"]


@override_settings(ORCHESTRATOR_QUEUED_TIMEOUT=1, ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0)
def test_a_job_its_dispatcher_is_still_enqueuing_is_not_lost(queue):
    (ti,) = _queued_long_ago()
    queue.empty()  # as if not on Redis yet
    redis = get_redis()
    keys = enqueuing.begin(redis, [(ti.queue, ti.queued_at)])
    assert schedule_once().lost == []
    enqueuing.end(redis, keys)  # the batch is done, and this job never made it: lost
    assert schedule_once().lost == [f"{ti.pk}:queue_lost"]
