"""The report of one instance of a mapped task costs the same whatever its number of instances:
the engine asks the database which states the instances are in (grouped), and never reads them
one by one."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.data import sql
from orchestrator.engine import reporting, storms
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import TaskInstance
from retries.states import TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue", "caches_held")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _report_cost(monkeypatch, ti: TaskInstance) -> tuple[int, int]:
    """(statements, rows read through the engine's written SQL) of one instance's success."""
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    rows = [0]
    real_fetch = sql.fetch

    def counting_fetch(*args, **kwargs):
        found = real_fetch(*args, **kwargs)
        rows[0] += len(found)
        return found

    monkeypatch.setattr(sql, "fetch", counting_fetch)
    storms.forget()  # the storm count, cached a second, is read by every report alike
    with CaptureQueriesContext(connection) as queries:
        assert reporting.report_success(ti.pk, ti.attempt_token)
    monkeypatch.setattr(sql, "fetch", real_fetch)
    return len(queries.captured_queries), rows[0]


def _costs(monkeypatch, width: int) -> list[tuple[int, int]]:
    """A mapped task of `width` instances, all but two succeeded: the cost of the report of the
    next to last (its downstream still waits) and of the last (its downstream becomes ready)."""
    dag = DagFactory(dag_id=f"mapped_{width}")
    TaskFactory(dag=dag, task_id="load", expand={"item": list(range(width))})
    TaskFactory(dag=dag, task_id="report", upstream=["load"])
    run = create_manual_run(dag)
    instances = TaskInstance.objects.filter(dag_run=run, task_id="load")
    assert instances.count() == width
    instances.filter(map_index__gte=2).update(state=TaskState.SUCCESS)
    costs = []
    for map_index in (0, 1):
        costs.append(_report_cost(monkeypatch, instances.get(map_index=map_index)))
        waiting = TaskInstance.objects.get(dag_run=run, task_id="report").state
        assert waiting == (TaskState.NONE if map_index == 0 else TaskState.QUEUED)
    return costs


def test_an_instance_report_reads_as_much_with_1000_instances_as_with_10(monkeypatch):
    assert _costs(monkeypatch, 10) == _costs(monkeypatch, 1000)
