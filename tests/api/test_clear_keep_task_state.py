"""POST .../clear with {"keep_task_state": true} keeps the task state; by default clearing empties
it; the run document serves it and each attempt's resume decision."""
from __future__ import annotations

import pytest

from orchestrator.engine import task_state_store
from orchestrator.engine.reporting import report_success
from tests.api.factories import chain_dag, make_run, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def run():
    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    task_state_store.apply(ti.pk, ti.attempt_token, [{"op": "set", "key": "offset", "value": 7}, {"op": "resume", "key": "", "value": "submitted"}])
    report_success(ti.pk, ti.attempt_token)
    return run


def _clear(client, run, body):
    return client.post(f"/api/v1/dags/etl/runs/{run.run_id}/tasks/extract/clear", body, content_type="application/json")


def _extract(document):
    return next(t for t in document["task_instances"] if t["task_id"] == "extract")


def test_the_run_document_serves_the_state_and_the_decision(alice_client, run):
    doc = _extract(alice_client.get(f"/api/v1/dags/etl/runs/{run.run_id}").json())
    assert doc["task_state"] == {"offset": 7}
    assert [a["resume"] for a in doc["attempts"]] == ["submitted"]
    assert _extract(alice_client.get(f"/api/v1/dags/etl/runs/{run.run_id}").json())["task_state"] == {"offset": 7}


def test_clear_keeps_the_state_when_asked(alice_client, run):
    response = _clear(alice_client, run, {"keep_task_state": True})
    assert response.status_code == 200
    assert _extract(response.json())["task_state"] == {"offset": 7}


def test_clear_empties_the_state_by_default(alice_client, run):
    response = _clear(alice_client, run, {})
    assert response.status_code == 200
    assert _extract(response.json())["task_state"] == {}


def test_a_keep_task_state_that_is_not_a_boolean_is_refused_changing_nothing(alice_client, run):
    response = _clear(alice_client, run, {"keep_task_state": "yes"})
    assert response.status_code == 400
    assert "keep_task_state" in response.json()["error"]
    assert _extract(alice_client.get(f"/api/v1/dags/etl/runs/{run.run_id}").json())["state"] == "success"
