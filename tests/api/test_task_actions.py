"""POST /api/v1/dags/DAG_ID/runs/RUN_ID/tasks/TASK_ID/{clear,mark_success,mark_failed,reclassify}"""
from __future__ import annotations

from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.test import Client

from orchestrator.models import AuditLog, Dag
from tests.api.factories import chain_dag, fail_until_failed, instance, make_run, start

pytestmark = pytest.mark.django_db

ACTIONS = ["clear", "mark_success", "mark_failed", "reclassify"]


@pytest.fixture
def failed_run():
    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract")
    return run


def url(run, task_id: str, action: str) -> str:
    return f"/api/v1/dags/{run.dag.dag_id}/runs/{quote(run.run_id, safe='')}/tasks/{task_id}/{action}"


@pytest.mark.parametrize("action", ACTIONS)
def test_it_needs_the_change_taskinstance_permission(bob_client, failed_run, action):
    """bob gets 403 for every action, and nothing changes."""
    response = bob_client.post(url(failed_run, "extract", action), {}, content_type="application/json")
    assert response.status_code == 403
    assert "orchestrator.change_taskinstance" in response.json()["error"]
    assert instance(failed_run, "extract").state == "failed"
    assert not AuditLog.objects.exists()


def test_it_lets_a_superuser_act(failed_run):
    """A superuser has every permission without being granted them."""
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    assert client.post(url(failed_run, "extract", "mark_success")).status_code == 200


def test_it_clears_and_returns_the_run_document(alice_client, failed_run):
    """clear with include_downstream: the updated run document, and an audit row with the note."""
    Dag.objects.filter(dag_id="etl").update(paused=True)
    response = alice_client.post(
        url(failed_run, "extract", "clear"), {"include_downstream": True, "note": "retry it"}, content_type="application/json"
    )
    assert response.status_code == 200
    doc = response.json()
    assert doc["state"] == "running"
    assert [ti["state"] for ti in doc["task_instances"]] == ["none", "none", "none"]
    assert doc["task_instances"][0]["last_failure_context"]["reason"] == "manual_clear"
    entry = AuditLog.objects.get()
    assert (entry.action, entry.username, entry.details["note"], entry.details["include_downstream"]) == (
        "clear", "alice", "retry it", True,
    )


def test_it_marks_success_and_failed(alice_client, failed_run):
    """mark_success and mark_failed answer with the run document in its new state."""
    doc = alice_client.post(url(failed_run, "extract", "mark_success")).json()
    assert doc["task_instances"][0]["state"] == "success"
    assert doc["task_instances"][1]["state"] == "queued"
    doc = alice_client.post(url(failed_run, "load", "mark_failed")).json()
    assert doc["task_instances"][2]["state"] == "failed"
    assert [e.action for e in AuditLog.objects.order_by("id")] == ["mark_success", "mark_failed"]


def test_it_reclassifies_with_a_note(alice_client, failed_run):
    """reclassify: the attempt becomes platform and the note is kept."""
    doc = alice_client.post(url(failed_run, "extract", "reclassify"), {"note": "node drained"}, content_type="application/json").json()
    extract = doc["task_instances"][0]
    assert extract["attempts"][0]["kind"] == "platform"
    assert extract["attempts"][0]["context"]["metadata"]["note"] == "node drained"
    assert extract["last_failure_context"]["reason"] == "manual_reclassify"


def test_it_answers_409_for_a_task_a_worker_holds(alice_client):
    """Acting on a running task is a 409 with the reason."""
    run = make_run(chain_dag("busy"))
    start(run, "extract")
    response = alice_client.post(url(run, "extract", "clear"))
    assert response.status_code == 409
    assert "while it is running" in response.json()["error"]


def test_it_answers_409_when_there_is_nothing_to_reclassify(alice_client):
    """A task with no user-charged failure cannot be reclassified."""
    run = make_run(chain_dag("fresh"))
    response = alice_client.post(url(run, "extract", "reclassify"))
    assert response.status_code == 409


@pytest.mark.parametrize(
    ("body", "message"),
    [('{"note": 5}', "note must be a string"), ('{"include_downstream": "yes"}', "include_downstream must be true or false")],
)
def test_it_refuses_bad_fields(alice_client, failed_run, body, message):
    """Fields of the wrong type are a 400 naming the field."""
    response = alice_client.post(url(failed_run, "extract", "clear"), body, content_type="application/json")
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_it_answers_404_for_an_unknown_task_or_run(alice_client, failed_run):
    """Unknown task, run or DAG: JSON 404."""
    assert alice_client.post(url(failed_run, "nope", "clear")).status_code == 404
    assert alice_client.post("/api/v1/dags/etl/runs/nope/tasks/extract/clear").status_code == 404
    assert alice_client.post("/api/v1/dags/nope/runs/x/tasks/extract/clear").status_code == 404
    assert "has no task 'nope'" in alice_client.post(url(failed_run, "nope", "clear")).json()["error"]
