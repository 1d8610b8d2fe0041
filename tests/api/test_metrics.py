"""GET /metrics: the Redis counters in the Prometheus text format."""
from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.api.tokens import create_token
from orchestrator.data import metrics
from retries.states import Reason
from tests.api.factories import chain_dag, fail, make_run

pytestmark = pytest.mark.django_db


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_it_serves_the_counters_that_any_process_incremented(bob_client):
    """Counters incremented through orchestrator.data.metrics show up with their labels."""
    metrics.increment(metrics.TASK_FAILURES, dag_id="m1", task_id="t", category="application", reason="task_exception")
    metrics.increment(metrics.TASK_FAILURES, dag_id="m1", task_id="t", category="application", reason="task_exception")
    metrics.increment(metrics.INFRASTRUCTURE_RETRIES, dag_id="m1", task_id="t", reason="worker_lost")
    metrics.increment(metrics.DEADLINE_MISSES, dag_id="m1")

    response = bob_client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    found = samples(text)
    labels = (("category", "application"), ("dag_id", "m1"), ("reason", "task_exception"), ("task_id", "t"))
    assert found[("orchestrator_task_failures_total", labels)] == 2
    assert found[("orchestrator_infrastructure_retries_total", (("dag_id", "m1"), ("reason", "worker_lost"), ("task_id", "t")))] == 1
    assert found[("orchestrator_deadline_misses_total", (("dag_id", "m1"),))] == 1
    assert "# TYPE orchestrator_task_failures_total counter" in text
    assert "# HELP orchestrator_deadline_misses_total" in text


def test_it_counts_failures_reported_by_workers(bob_client):
    """A failure reported through orchestrator.engine.reporting is counted by category and reason."""
    run = make_run(chain_dag("metered", retries=3))
    fail(run, "extract")
    fail(run, "extract", Reason.WORKER_LOST, fingerprint=None)
    found = samples(bob_client.get("/metrics").content.decode())
    app = (("category", "application"), ("dag_id", "metered"), ("reason", "task_exception"), ("task_id", "extract"))
    infra = (("category", "infrastructure"), ("dag_id", "metered"), ("reason", "worker_lost"), ("task_id", "extract"))
    assert found[("orchestrator_task_failures_total", app)] == 1
    assert found[("orchestrator_task_failures_total", infra)] == 1
    assert found[("orchestrator_infrastructure_retries_total", (("dag_id", "metered"), ("reason", "worker_lost"), ("task_id", "extract")))] == 1


def test_it_accepts_a_bearer_token(bob):
    """A scraper authenticates with a bearer token."""
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {create_token(bob)}")
    assert response.status_code == 200
    families = {family.name for family in text_string_to_metric_families(response.content.decode())}
    assert {"orchestrator_task_failures", "orchestrator_infrastructure_retries", "orchestrator_deadline_misses"} <= families


def test_it_refuses_anonymous_scrapes(anonymous_client):
    """No login, no token: 401 JSON."""
    response = anonymous_client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["error"]


def test_a_reclassification_is_counted_as_moved_not_taken_back(bob_client, alice):
    """The failure stays counted as it happened; its move to the platform has its own counter,
    so the failures page (which reads the attempt as it is now) and /metrics can be reconciled."""
    from orchestrator.operations import actions
    from tests.api.factories import instance

    run = make_run(chain_dag("moved", retries=0))
    fail(run, "extract")
    actions.reclassify(instance(run, "extract"), alice, note="node drained")
    found = samples(bob_client.get("/metrics").content.decode())
    app = (("category", "application"), ("dag_id", "moved"), ("reason", "task_exception"), ("task_id", "extract"))
    moved = (("dag_id", "moved"), ("from_category", "application"), ("from_reason", "task_exception"), ("task_id", "extract"))
    assert found[("orchestrator_task_failures_total", app)] == 1
    assert found[("orchestrator_reclassifications_total", moved)] == 1


def test_it_serves_the_gauges_of_what_runs_and_waits_now(bob_client, settings):
    """orchestrator_tasks_running, orchestrator_queue_depth{queue}, orchestrator_workers_alive and
    orchestrator_circuit_state{circuit}, read at scrape time (a second scrape sees the change)."""
    from rq import Queue, Worker

    from orchestrator.foundation.redis_conn import get_redis
    from orchestrator.models import Circuit, TaskInstance

    run = make_run(chain_dag("gauged"))
    first = run.task_instances.order_by("id").first()
    TaskInstance.objects.filter(pk=first.pk).update(state="running")
    Circuit.objects.create(name="gauge-downstream")
    redis = get_redis()
    queue = Queue("gauge-queue", connection=redis)
    for n in range(3):
        queue.enqueue("tests.worker.tasks.succeed", job_id=f"gauge-{n}")
    # A worker an earlier test of this process left registered may still look alive: count from it.
    alive_before = samples(bob_client.get("/metrics").content.decode())[("orchestrator_workers_alive", ())]
    worker = Worker([queue], connection=redis, name="gauge-worker")
    worker.register_birth()
    try:
        found = samples(bob_client.get("/metrics").content.decode())
        assert found[("orchestrator_tasks_running", ())] == 1
        assert found[("orchestrator_queue_depth", (("queue", "gauge-queue"),))] == 3
        assert found[("orchestrator_workers_alive", ())] == alive_before + 1
        assert found[("orchestrator_circuit_state", (("circuit", "gauge-downstream"),))] == 0
        queue.empty()
        TaskInstance.objects.filter(pk=first.pk).update(state="success")
    finally:
        worker.register_death()
    found = samples(bob_client.get("/metrics").content.decode())
    assert found[("orchestrator_tasks_running", ())] == 0
    assert found.get(("orchestrator_queue_depth", (("queue", "gauge-queue"),)), 0) == 0
    assert found[("orchestrator_workers_alive", ())] == alive_before
