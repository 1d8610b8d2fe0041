"""Every refusal is `{"error": "..."}` with the status clients rely on: a bad body is a 400 naming
the field (never a 422 with a list of details), a method a path does not serve a 405 after login."""
from __future__ import annotations

import pytest
from django.test import Client

from orchestrator.api.tokens import create_token
from orchestrator.models import Backfill, DagRun
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/dags/etl/runs"
BACKFILLS = "/api/v1/dags/daily/backfills"


@pytest.fixture
def daily():
    dag = chain_dag("daily")
    dag.schedule = "@daily"
    dag.save()
    return dag


def _error(response) -> str:
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"from": 1, "to": "2026-01-02"}, 400, "from must be a string, got int: 1"),
        ({"from": "2026-01-01", "to": "2026-01-02", "max_active_runs": "5"}, 400, "max_active_runs must be a whole number, got str: '5'"),
        ({"from": "2026-01-01", "to": "2026-01-02", "max_active_runs": 10_001}, 400, "max_active_runs must be at most"),
        ({"from": "2026-01-01", "to": "2026-01-02", "backwards": 1}, 400, "backwards must be true or false, got int: 1"),
        ({"from": "2026-01-01", "to": "2026-01-02", "reprocess": "all"}, 400, "reprocess must be"),
        ({"from": "2026-01-01", "to": "2026-01-02", "dry_run": None}, 400, "dry_run must be true or false, got NoneType"),
        ({"from": "2026-01-01", "to": "2026-01-02", "surprise": 1}, 400, "surprise is not a known field (known: from, to, reprocess"),
        ({"to": "2026-01-02"}, 400, "from is required"),
    ],
)
def test_a_refused_body_is_a_400_naming_the_field_and_the_value(alice_client, daily, body, status, message):
    response = alice_client.post(BACKFILLS, body, content_type="application/json")
    assert response.status_code == status
    assert message in _error(response)
    assert not Backfill.objects.exists()


def test_a_null_map_index_is_refused_not_taken_for_every_instance(alice_client):
    chain_dag("etl")
    response = alice_client.post(f"{RUNS}/x/tasks/extract/clear", {"map_index": None}, content_type="application/json")
    assert response.status_code == 400
    assert "map_index must be a whole number" in _error(response)


def test_a_bearer_post_needs_no_csrf_token_and_a_session_post_does(alice):
    chain_dag("etl")
    token_client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {create_token(alice)}")
    assert token_client.post(RUNS, {}, content_type="application/json").status_code == 201
    session_client = Client(enforce_csrf_checks=True)
    session_client.force_login(alice)
    refused = session_client.post(RUNS, {}, content_type="application/json")
    assert refused.status_code == 403
    assert "CSRF" in _error(refused)
    assert DagRun.objects.count() == 1


def test_a_method_the_path_does_not_serve_is_a_json_405_after_login(alice_client, anonymous_client):
    chain_dag("etl")
    response = alice_client.delete(RUNS)
    assert response.status_code == 405
    assert response["Allow"] == "GET, POST"
    assert "method DELETE not allowed" in _error(response)
    assert anonymous_client.delete(RUNS).status_code == 401
    assert alice_client.put("/api/v1/dags").status_code == 405


def test_the_document_promises_no_422_and_only_error_bodies_for_errors(bob_client):
    document = bob_client.get("/api/v1/openapi.json").json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            assert "422" not in statuses, (method, path)
            assert "401" in statuses, (method, path)
            for status in statuses - {"200", "201"}:
                schema = operation["responses"][status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)


def test_a_bug_in_a_view_reaches_django_and_is_a_json_500(bob, monkeypatch):
    """ninja does not swallow an unexpected exception into its own answer: Django logs it and
    the API's 500 handler answers in JSON."""
    from orchestrator.api import views

    def broken(dag):
        raise RuntimeError("a bug")

    chain_dag("etl")
    monkeypatch.setattr(views, "_dag_with_last_run", broken)
    client = Client(raise_request_exception=False)
    client.force_login(bob)
    response = client.get("/api/v1/dags/etl")
    assert response.status_code == 500
    assert "internal server error" in _error(response)
