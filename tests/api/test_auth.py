"""Who may call the API and /metrics: session users, bearer tokens, nobody else."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from orchestrator.api.tokens import create_token, hash_key
from orchestrator.models import ApiToken
from tests.api.factories import chain_dag, make_run

pytestmark = pytest.mark.django_db

RUN_ID = "manual__2026-01-01T00:00:00+00:00"
TASK = f"/api/v1/dags/etl/runs/{RUN_ID}/tasks/extract"
READS = [
    "/api/v1/dags",
    "/api/v1/dags/etl",
    "/api/v1/dags/etl/runs",
    f"/api/v1/dags/etl/runs/{RUN_ID}",
    "/api/v1/failures",
    "/metrics",
    "/api/v1/no-such-endpoint",
    "/api/",
]
WRITES = ["/api/v1/dags/etl/runs", f"{TASK}/clear", f"{TASK}/mark_success", f"{TASK}/mark_failed", f"{TASK}/reclassify"]


@pytest.fixture
def etl_run():
    return make_run(chain_dag("etl"), at=datetime(2026, 1, 1, tzinfo=timezone.utc))


@pytest.mark.parametrize("path", READS)
def test_it_answers_401_json_to_anonymous_reads(anonymous_client, etl_run, path):
    """Every API path and /metrics: 401 with a JSON error, never data."""
    response = anonymous_client.get(path)
    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert "authentication required" in response.json()["error"]
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("path", WRITES)
def test_it_answers_401_json_to_anonymous_actions(anonymous_client, etl_run, path):
    """Anonymous POSTs are refused before anything else is looked at."""
    response = anonymous_client.post(path, {}, content_type="application/json")
    assert response.status_code == 401
    assert response.json()["error"]


def test_it_keeps_healthz_public(anonymous_client):
    """/healthz is the only URL open to anonymous clients."""
    assert anonymous_client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/api/v1/dags", "/metrics"])
def test_it_accepts_a_bearer_token_and_records_its_use(bob, etl_run, path):
    """Authorization: Bearer TOKEN authenticates a client without a session."""
    key = create_token(bob)
    response = Client().get(path, HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200
    token = ApiToken.objects.get(user=bob)
    assert token.key_hash == hash_key(key)
    assert key not in token.key_hash
    assert token.last_used_at is not None


def test_a_tokens_use_is_written_once_a_minute_not_on_every_request(bob, etl_run):
    key = create_token(bob)
    client = Client()
    assert client.get("/api/v1/dags", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    first = ApiToken.objects.get(user=bob).last_used_at
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/api/v1/dags", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    assert not [q for q in queries.captured_queries if "UPDATE" in q["sql"] and "apitoken" in q["sql"]]
    assert ApiToken.objects.get(user=bob).last_used_at == first
    ApiToken.objects.filter(user=bob).update(last_used_at=first - timedelta(minutes=2))
    assert client.get("/api/v1/dags", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    assert ApiToken.objects.get(user=bob).last_used_at > first


@pytest.mark.parametrize(
    "header", ["Bearer not-a-real-token", "Bearer ", "Basic Ym9iOnNlY3JldA==", "Token abc"]
)
def test_it_refuses_a_wrong_token(bob, header):
    """A wrong, empty or non-bearer Authorization header is 401, not a fallback to anonymous."""
    create_token(bob)
    response = Client().get("/api/v1/dags", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["error"]


def test_it_refuses_the_token_of_an_inactive_user(bob):
    """Deactivating a user revokes their tokens."""
    key = create_token(bob)
    bob.is_active = False
    bob.save()
    assert Client().get("/api/v1/dags", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 401


def test_it_lets_bearer_clients_post_without_csrf(alice, etl_run):
    """A bearer-token POST needs no CSRF token (no browser sends that header on its own)."""
    key = create_token(alice)
    client = Client(enforce_csrf_checks=True)
    response = client.post("/api/v1/dags/etl/runs", {}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 201


def test_it_protects_session_posts_with_csrf(alice, etl_run):
    """A session user's POST without the CSRF token is 403; with it, it goes through."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    refused = client.post("/api/v1/dags/etl/runs", {}, content_type="application/json")
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["error"]

    client.get("/")  # the page sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    accepted = client.post("/api/v1/dags/etl/runs", {}, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert accepted.status_code == 201


def test_it_answers_405_json_to_a_wrong_method(alice_client, etl_run):
    """A method an endpoint does not take is a JSON 405 naming the allowed ones."""
    response = alice_client.delete("/api/v1/dags/etl")
    assert response.status_code == 405
    assert response["Allow"] == "GET"


def test_it_answers_404_json_for_an_unknown_api_path(bob_client):
    """An unknown path under /api/ is a JSON 404 for a logged-in client."""
    response = bob_client.get("/api/v1/nope")
    assert response.status_code == 404
    assert "/api/v1/nope" in response.json()["error"]


def _trigger_as(user) -> int:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {create_token(user)}")
    return client.post("/api/v1/dags/etl/runs", content_type="application/json").status_code


def test_a_tokens_permissions_are_its_users_own_and_its_groups(bob, etl_run):
    """Read with the token in one statement: a permission of the user's own, one of a group it
    belongs to, or none, each decides the action as Django's own check would."""
    from django.contrib.auth.models import Group, Permission

    trigger = Permission.objects.get(codename="trigger_dagrun", content_type__app_label="orchestrator")
    assert _trigger_as(bob) == 403
    operators = Group.objects.create(name="operators")
    operators.permissions.add(trigger)
    bob.groups.add(operators)
    assert _trigger_as(bob) == 201
    bob.groups.remove(operators)
    assert _trigger_as(bob) == 403
    bob.user_permissions.add(trigger)
    assert _trigger_as(bob) == 201


def test_a_tokens_user_and_permissions_are_one_read(alice, etl_run):
    key = create_token(alice)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.get("/api/v1/dags")  # the token's use recorded: a write of its own, once a minute
    with CaptureQueriesContext(connection) as captured:
        assert client.post("/api/v1/dags/etl/runs", content_type="application/json").status_code == 201
    statements = [query["sql"] for query in captured.captured_queries]
    assert not [sql for sql in statements if "auth_permission" in sql and "orchestrator_apitoken" not in sql], statements
