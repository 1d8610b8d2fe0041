"""Workers and queues: live RQ workers with what they run, queue depth, unattended queues; the API."""
from __future__ import annotations

import pytest
from rq import Queue, Worker

from orchestrator.foundation.redis_conn import get_redis
from tests.api.factories import chain_dag, make_run, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis():
    connection = get_redis()
    yield connection
    for worker in Worker.all(connection=connection):
        worker.register_death()
    for queue in Queue.all(connection=connection):
        queue.delete(delete_jobs=True)


@pytest.fixture
def live_worker(redis):
    worker = Worker(["default"], name="test-worker", connection=redis)
    worker.register_birth()
    worker.heartbeat()
    redis.hset("rq:worker:test-worker", "concurrency", 4)
    return worker


def test_it_lists_live_workers_with_their_running_attempts(bob_client, live_worker):
    run = make_run(chain_dag("etl"))
    start(run, "extract")
    html = bob_client.get("/workers/").content.decode()
    assert 'data-worker="test-worker"' in html
    assert "1 / 4" in html  # running / concurrency
    assert f"/dags/etl/runs/{run.run_id}/tasks/extract" in html
    assert "RQ&#x27;s own views" not in html
    assert "/django-rq/" not in html


def test_concurrency_defaults_to_one(bob_client, redis):
    worker = Worker(["default"], name="plain-worker", connection=redis)
    worker.register_birth()
    doc = bob_client.get("/api/v1/workers").json()
    [row] = doc["workers"]
    assert (row["name"], row["concurrency"], row["queues"], row["running"]) == ("plain-worker", 1, ["default"], [])


def test_a_worker_whose_heartbeat_stopped_is_not_listed_nor_counted(bob_client, redis, live_worker, settings):
    """RQ keeps a killed worker's record for minutes: it is gone from the list and the gauge
    once its heartbeat is older than a live worker's can be (1.5 heartbeat intervals)."""
    from datetime import UTC, datetime, timedelta

    from rq.utils import utcformat

    from tests.api.test_metrics import samples

    settings.ORCHESTRATOR_HEARTBEAT_INTERVAL = 2
    dead = Worker(["default"], name="killed-worker", connection=redis)
    dead.register_birth()
    redis.hset("rq:worker:killed-worker", "last_heartbeat", utcformat(datetime.now(UTC) - timedelta(seconds=4)))
    assert [row["name"] for row in bob_client.get("/api/v1/workers").json()["workers"]] == ["test-worker"]
    assert 'data-worker="killed-worker"' not in bob_client.get("/workers/").content.decode()
    assert samples(bob_client.get("/metrics").content.decode())[("orchestrator_workers_alive", ())] == 1


def test_a_queue_with_work_and_no_worker_is_flagged(bob_client, redis):
    Queue("orphans", connection=redis).enqueue("tests.api.factories.noop")
    html = bob_client.get("/workers/").content.decode()
    assert 'data-queue="orphans"' in html
    assert "no worker listening" in html
    assert "ago</time>" in html  # the oldest job's age


def test_the_api_lists_running_attempts(bob_client, anonymous_client, live_worker):
    run = make_run(chain_dag("etl"))
    start(run, "extract")
    [row] = bob_client.get("/api/v1/workers").json()["workers"]
    assert row["running"] == [{"dag_id": "etl", "run_id": run.run_id, "task_id": "extract"}]
    assert row["concurrency"] == 4
    assert row["last_heartbeat"]
    assert anonymous_client.get("/api/v1/workers").status_code == 401


def test_staff_get_a_link_to_django_rq(client, django_user_model, redis):
    staff = django_user_model.objects.create_user("root", password="x", is_staff=True, is_superuser=True)
    client.force_login(staff)
    assert "/django-rq/" in client.get("/workers/").content.decode()
    assert client.get("/django-rq/").status_code == 200


def test_django_rq_is_staff_only(bob_client):
    assert bob_client.get("/django-rq/").status_code == 302


def test_its_query_count_is_bounded(bob_client, live_worker, django_assert_max_num_queries):
    for i in range(5):
        start(make_run(chain_dag(f"d{i}")), "extract")
    with django_assert_max_num_queries(5):
        bob_client.get("/workers/")
