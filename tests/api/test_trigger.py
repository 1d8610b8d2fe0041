"""POST /api/v1/dags/DAG_ID/runs"""
from __future__ import annotations

import pytest

from orchestrator.models import AuditLog, Dag, DagRun
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db


def test_it_triggers_a_run_with_conf(alice_client):
    """201 with the run document of the new run, conf included."""
    chain_dag("etl")
    response = alice_client.post("/api/v1/dags/etl/runs", {"conf": {"day": "2026-11-21"}}, content_type="application/json")
    assert response.status_code == 201
    doc = response.json()
    assert doc["run_id"].startswith("manual__")
    assert doc["conf"] == {"day": "2026-11-21"}
    assert [ti["task_id"] for ti in doc["task_instances"]] == ["extract", "transform", "load"]
    assert DagRun.objects.get(run_id=doc["run_id"]).triggered_by == "alice"
    assert AuditLog.objects.get(action="trigger").run_id == doc["run_id"]


def test_it_triggers_without_a_body(alice_client):
    """The JSON body is optional."""
    chain_dag("etl")
    assert alice_client.post("/api/v1/dags/etl/runs").status_code == 201


def test_a_paused_dags_run_is_created_queued_and_starts_once_it_is_unpaused(alice_client):
    """As Airflow does: the trigger creates the run, which stands still while its DAG is paused."""
    from orchestrator.engine.scheduler import schedule_once

    chain_dag("etl")
    Dag.objects.filter(dag_id="etl").update(paused=True)
    response = alice_client.post("/api/v1/dags/etl/runs", {}, content_type="application/json")
    assert response.status_code == 201
    assert response.json()["state"] == "queued"
    schedule_once()
    run = DagRun.objects.get()
    assert run.state == "queued"
    assert set(run.task_instances.values_list("state", flat=True)) == {"none"}
    Dag.objects.filter(dag_id="etl").update(paused=False)
    schedule_once()
    run.refresh_from_db()
    assert run.state == "running"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"conf": [1, 2]}', "conf must be a JSON object, got list"),
        ('{"conf": "x"}', "conf must be a JSON object, got str"),
        ("[1]", "request body must be a JSON object"),
        ("{not json", "request body is not valid JSON"),
    ],
)
def test_it_refuses_a_bad_body(alice_client, body, message):
    """conf must be an object and the body valid JSON: 400 with the reason."""
    chain_dag("etl")
    response = alice_client.post("/api/v1/dags/etl/runs", body, content_type="application/json")
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_it_needs_the_trigger_permission(bob_client):
    """bob may read but not trigger: 403 naming the permission."""
    chain_dag("etl")
    response = bob_client.post("/api/v1/dags/etl/runs", {}, content_type="application/json")
    assert response.status_code == 403
    assert "orchestrator.trigger_dagrun" in response.json()["error"]
    assert not DagRun.objects.exists()


def test_it_answers_404_for_an_unknown_dag(alice_client):
    """Triggering an unknown DAG is a JSON 404."""
    assert alice_client.post("/api/v1/dags/nope/runs").status_code == 404


def test_trigger_dag_of_a_paused_dag_prints_the_run_and_says_it_waits():
    from io import StringIO

    from django.core.management import call_command

    chain_dag("etl")
    Dag.objects.filter(dag_id="etl").update(paused=True)
    out, err = StringIO(), StringIO()
    call_command("trigger_dag", "etl", stdout=out, stderr=err)
    assert DagRun.objects.get().run_id == out.getvalue().splitlines()[0]
    assert "DAG 'etl' is paused: the run is queued and starts once the DAG is unpaused" in err.getvalue()
