"""Two schedulers at once never dispatch one attempt twice."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rq import Queue

from orchestrator.engine.run_creation import create_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import DagRun, TaskAttempt, TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def test_it_dispatches_each_task_once_with_two_schedulers(spawn):
    """Two real scheduler processes race over 40 runs; every task gets exactly one attempt and one job."""
    queue = Queue("default", connection=get_redis())
    queue.empty()
    dag = DagFactory(dag_id="race")
    TaskFactory(dag=dag, task_id="one")
    TaskFactory(dag=dag, task_id="two")
    dag.max_active_runs = 100
    dag.save()
    base = timezone.now()
    for i in range(40):
        create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=base + timedelta(seconds=i))
    first, second = spawn("run_scheduler", "--once"), spawn("run_scheduler", "--once")
    for proc in (first, second):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    assert TaskInstance.objects.filter(state="queued").count() == 80
    assert TaskAttempt.objects.count() == 80
    assert set(TaskInstance.objects.values_list("attempt_token", flat=True)) == {1}
    job_ids = queue.job_ids
    assert len(job_ids) == 80 == len(set(job_ids))
    queue.empty()
