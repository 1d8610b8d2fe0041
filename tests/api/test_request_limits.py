"""What PostgreSQL cannot store, bodies too large, and failures outside a view: all JSON errors."""
from __future__ import annotations

import pytest
from django.test import Client, RequestFactory

from orchestrator.api import errors
from orchestrator.api.tokens import create_token
from orchestrator.models import DagRun
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/dags/etl/runs"


@pytest.fixture
def etl():
    return chain_dag("etl")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"conf": {"day": "2026\\u0000-01-01"}}', "conf.day"),
        ('{"conf": {"bad\\u0000key": 1}}', "conf key"),
        ('{"conf": {"nested": [{"deep": "\\u0000"}]}}', "conf.nested[0].deep"),
    ],
)
def test_a_nul_in_conf_is_a_400_naming_the_field(alice_client, etl, body, field):
    """PostgreSQL's jsonb cannot hold \\u0000: refused before it gets there, nothing created."""
    response = alice_client.post(RUNS, body, content_type="application/json")
    assert response.status_code == 400
    assert field in response.json()["error"]
    assert "NUL" in response.json()["error"]
    assert not DagRun.objects.exists()


def test_a_nul_in_a_note_is_a_400(alice_client, etl):
    response = alice_client.post(
        "/api/v1/dags/etl/runs/x/tasks/extract/clear", '{"note": "a\\u0000b"}', content_type="application/json"
    )
    assert response.status_code == 400
    assert "note must not contain the NUL" in response.json()["error"]


@pytest.mark.parametrize(
    ("url", "name"),
    [("/api/v1/dags/et%00l", "dag_id"), ("/api/v1/failures?dag_id=%00", "dag_id"), (f"{RUNS}?state=%00", "state")],
)
def test_a_nul_in_a_path_or_query_parameter_is_a_400(bob_client, etl, url, name):
    response = bob_client.get(url)
    assert response.status_code == 400
    assert f"{name} must not contain the NUL" in response.json()["error"]


@pytest.mark.parametrize("since", ["0189-06-04T02:15:41.6-17:38", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"])
def test_since_with_any_iso_offset_is_answered(bob_client, since):
    """ISO 8601 allows offsets up to ±23:59, PostgreSQL up to ±15:59, datetime years 1-9999."""
    response = bob_client.get("/api/v1/failures", {"since": since})
    assert response.status_code == 200
    assert response.json()["count"] == 0


def test_a_body_too_large_is_a_json_413_for_a_token(settings, alice, etl):
    """Over DATA_UPLOAD_MAX_MEMORY_SIZE: 413 with a JSON error, not Django's HTML page."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    token = create_token(alice)
    body = '{"conf": {"blob": "' + "x" * 2000 + '"}}'
    response = Client().post(RUNS, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert "too large" in response.json()["error"]
    assert not DagRun.objects.exists()


def test_a_form_too_large_is_a_json_413_for_a_session_user(settings, alice_client, etl):
    """A session user's form body is read by the CSRF check, before the view: still JSON 413."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = alice_client.post(RUNS, {"blob": "x" * 2000})
    assert response.status_code == 413
    assert "too large" in response.json()["error"]


@pytest.mark.parametrize("as_session", [True, False])
def test_a_malformed_multipart_body_is_a_json_400(alice, alice_client, etl, as_session):
    """No boundary in a multipart body: 400 JSON whether the CSRF check or the view reads it."""
    client = alice_client if as_session else Client(HTTP_AUTHORIZATION=f"Bearer {create_token(alice)}")
    response = client.post(RUNS, b"--x\r\n", content_type="multipart/form-data")
    assert response.status_code == 400
    assert "multipart" in response.json()["error"]


def test_a_disallowed_host_on_the_api_is_a_json_400(bob_client):
    response = bob_client.get("/api/v1/dags", HTTP_HOST="evil.example.com")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize(("path", "json_expected"), [("/api/v1/dags", True), ("/metrics", True), ("/dags/etl/", False)])
def test_server_errors_are_json_under_the_api_and_pages_elsewhere(path, json_expected):
    response = errors.server_error(RequestFactory().get(path))
    assert response.status_code == 500
    assert (response["Content-Type"] == "application/json") is json_expected
