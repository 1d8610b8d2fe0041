"""A trigger answers with the run's document built from what it wrote (`run_creation.ManualRun`)
when it knows every task instance: that answer is the document a read of the run gives."""
from __future__ import annotations

import pytest
from django.test import Client

from deadlines.models import DeadlineDefinition
from orchestrator.api.tokens import create_token
from orchestrator.models import Dag, Pool
from tests.api.factories import DagFactory, TaskFactory, chain_dag

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(alice) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {create_token(alice)}")


def _trigger_and_read(api: Client, dag_id: str, body: dict | None = None) -> tuple[dict, dict]:
    answer = api.post(f"/api/v1/dags/{dag_id}/runs", data=body or {}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    read = api.get(f"/api/v1/dags/{dag_id}/runs/{answer.json()['run_id']}")
    assert read.status_code == 200
    return answer.json(), read.json()


def test_a_chain_s_trigger_answers_the_document_a_read_gives(api, empty_default_queue):
    chain_dag("etl")
    answer, read = _trigger_and_read(api, "etl", {"conf": {"day": 1}, "logical_date": "2026-01-31T02:00:00"})
    assert answer == read
    assert [ti["state"] for ti in answer["task_instances"]] == ["queued", "none", "none"]
    assert len(answer["task_instances"][0]["attempts"]) == 1


def test_tasks_a_pool_holds_back_are_answered_scheduled_as_read(api, empty_default_queue):
    Pool.objects.create(name="narrow", slots=1)
    dag = DagFactory(dag_id="fan", default_args={"pool": "narrow"})
    for task_id in ("a", "b", "c"):
        TaskFactory(dag=dag, task_id=task_id, upstream=[])
    answer, read = _trigger_and_read(api, "fan")
    assert answer == read
    assert sorted(ti["state"] for ti in answer["task_instances"]) == ["queued", "scheduled", "scheduled"]


def test_a_run_waiting_for_a_slot_is_answered_queued_as_read(api, empty_default_queue):
    chain_dag("etl")
    Dag.objects.filter(dag_id="etl").update(max_active_runs=1)
    _trigger_and_read(api, "etl")
    answer, read = _trigger_and_read(api, "etl")
    assert answer == read
    assert answer["state"] == "queued"


def test_a_dispatch_redis_refuses_is_answered_undone_as_read(api, settings):
    chain_dag("etl")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    answer, read = _trigger_and_read(api, "etl")
    assert answer == read
    assert answer["task_instances"][0]["state"] == "scheduled"
    assert answer["task_instances"][0]["attempts"] == []


def test_a_dag_with_deadlines_is_answered_as_read(api, empty_default_queue):
    dag = chain_dag("etl")
    DeadlineDefinition.objects.create(dag=dag, reference="dagrun_queued_at", interval=400, callback="notifier:log")
    answer, read = _trigger_and_read(api, "etl")
    assert answer == read
    assert len(answer["deadlines"]) == 1
