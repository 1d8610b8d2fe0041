"""The scheduler's look for lost tasks and jobs reads the active task instances only.

TaskInstance's default ordering is its run's (the run's queued_at, newest first): a query that
kept it joined every run, finished history included, to sort a few thousand active rows. Over a
year of history (20,000 runs) that join was most of the pass's database time."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rq import Queue

from orchestrator.engine import scheduler
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import DagRun, TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue():
    q = Queue("default", connection=get_redis())
    q.empty()
    yield q
    q.empty()


def test_the_lost_look_does_not_join_the_runs(queue):
    dag = DagFactory()
    for i in range(3):
        TaskFactory(dag=dag, task_id=f"t{i}")
    run = create_manual_run(dag)
    assert TaskInstance.objects.filter(dag_run=run, state="queued").count() == 3
    assert queue.count == 3

    report = scheduler.PassReport()
    with CaptureQueriesContext(connection) as captured:
        scheduler._find_lost_tasks(shared_now(), report)

    assert report.lost == []  # waiting their turn: nothing is lost
    reads = [q["sql"] for q in captured.captured_queries if f'FROM "{TaskInstance._meta.db_table}"' in q["sql"]]
    assert len(reads) == 3  # running with a stale heartbeat, claimed with one, queued and unclaimed
    for sql in reads:
        assert DagRun._meta.db_table not in sql, sql
