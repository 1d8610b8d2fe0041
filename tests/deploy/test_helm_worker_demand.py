"""The KEDA query of the chart's ScaledObjects, run against the real PostgreSQL.

The query is taken from the rendered ScaledObject itself (it lives in
deploy/helm/orchestrator/files/worker-demand.sql), and must answer
ceil((queued + running task instances of the Deployment's queues) / its concurrency):
no other state counts, no other queue counts.
"""
from __future__ import annotations

import math

import pytest
from django.db import connection

from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import TaskInstance
from retries.states import TaskState
from tests.deploy.test_helm_chart import of_kind, render
from tests.engine.factories import DagFactory, TaskFactory

QUEUES = ["etl", "etl.backfill:eu"]
CONCURRENCY = 4

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def query() -> str:
    objects = render(
        sets={
            "keda.enabled": "true",
            "workers[0].name": "etl",
            "workers[0].queues[0]": QUEUES[0],
            "workers[0].queues[1]": QUEUES[1],
            "workers[0].concurrency": str(CONCURRENCY),
            "workers[0].replicas": "1",
            "workers[0].resources.requests.cpu": "1",
        }
    )
    (scaled,) = of_kind(objects, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    return trigger["metadata"]["query"]


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("KEDA's postgresql scaler runs the query on PostgreSQL")


def workers_wanted(query: str) -> float:
    with connection.cursor() as cursor:
        cursor.execute(query)
        (value,) = cursor.fetchone()
    return float(value)  # KEDA scans the first column as a float64


def instances(counts: dict[tuple[str, str], int]) -> None:
    """Task instances of one run, `counts[(queue, state)]` of each."""
    dag = DagFactory()
    total = sum(counts.values())
    for position in range(total):
        TaskFactory(dag=dag, task_id=f"t{position}", position=position)
    run = create_manual_run(dag)
    ids = iter(TaskInstance.objects.filter(dag_run=run).order_by("id").values_list("id", flat=True))
    for (queue, state), count in counts.items():
        chosen = [next(ids) for _ in range(count)]
        TaskInstance.objects.filter(id__in=chosen).update(queue=queue, state=state)


def test_an_idle_cluster_wants_no_worker(query):
    assert workers_wanted(query) == 0


def test_it_counts_queued_and_running_of_its_queues_only(query):
    counts: dict[tuple[str, str], int] = {}
    for state in TaskState:
        counts[(QUEUES[0], state)] = 3
        counts[(QUEUES[1], state)] = 2
        counts[("default", state)] = 5  # another Deployment's queue
    instances(counts)
    busy = 3 + 3 + 2 + 2  # queued and running, in each of the two queues
    assert workers_wanted(query) == math.ceil(busy / CONCURRENCY) == 3


@pytest.mark.parametrize(("busy", "wanted"), [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_it_rounds_up_to_whole_workers(query, busy, wanted):
    running = busy // 2
    instances({(QUEUES[0], TaskState.QUEUED): busy - running, (QUEUES[1], TaskState.RUNNING): running})
    assert workers_wanted(query) == wanted


def test_tasks_waiting_for_a_retry_or_a_slot_do_not_start_workers(query):
    """scheduled (held by a pool or limit), up_for_retry, none: nothing for a worker yet."""
    instances({(QUEUES[0], TaskState.SCHEDULED): 40, (QUEUES[0], TaskState.UP_FOR_RETRY): 40, (QUEUES[0], TaskState.NONE): 40})
    assert workers_wanted(query) == 0
