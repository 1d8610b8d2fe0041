"""The backfill endpoints: create (or preview), read, pause, unpause, cancel; personas for permissions."""
from __future__ import annotations

import json

import pytest

from orchestrator.models import AuditLog, Backfill, Dag, DagRun
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db

BODY = {"from": "2026-03-28", "to": "2026-03-30"}


@pytest.fixture
def dag() -> Dag:
    dag = chain_dag("etl")
    dag.schedule, dag.timezone = "@daily", "Europe/Amsterdam"
    dag.save()
    return dag


def post(client, path, body=None):
    return client.post(f"/api/v1{path}", data=json.dumps(body or {}), content_type="application/json")


def test_it_creates_a_backfill_and_answers_its_document(alice_client, dag):
    response = post(alice_client, "/dags/etl/backfills", {**BODY, "max_active_runs": 2, "backwards": True, "conf": {"k": "v"}, "reprocess": "failed"})
    assert response.status_code == 201, response.content
    doc = response.json()
    backfill = Backfill.objects.get()
    assert doc == {
        "id": backfill.pk,
        "dag_id": "etl",
        "state": "running",
        "from": "2026-03-27T23:00:00+00:00",
        "to": "2026-03-29T22:00:00+00:00",
        "reprocess": "failed",
        "max_active_runs": 2,
        "backwards": True,
        "conf": {"k": "v"},
        "created_by": "alice",
        "created_at": doc["created_at"],
        "end_date": None,
        "runs": {"total": 3, "pending": 3, "queued": 0, "running": 0, "success": 0, "failed": 0},
        "skipped": 0,
        "cancelled": 0,
    }
    assert alice_client.get(f"/api/v1/backfills/{backfill.pk}").json() == doc
    entry = AuditLog.objects.get(action="backfill_create")
    assert (entry.username, entry.dag_id, entry.details["backfill_id"]) == ("alice", "etl", backfill.pk)


def test_a_dry_run_answers_each_date_and_creates_nothing(alice_client, dag):
    response = post(alice_client, "/dags/etl/backfills", {**BODY, "dry_run": True})
    assert response.status_code == 200
    assert response.json() == {
        "dates": [
            {"logical_date": "2026-03-27T23:00:00+00:00", "action": "create"},
            {"logical_date": "2026-03-28T23:00:00+00:00", "action": "create"},
            {"logical_date": "2026-03-29T22:00:00+00:00", "action": "create"},
        ]
    }
    assert not Backfill.objects.exists()


def test_pause_unpause_and_cancel_are_audited(alice_client, dag):
    backfill_id = post(alice_client, "/dags/etl/backfills", BODY).json()["id"]
    assert post(alice_client, f"/backfills/{backfill_id}/pause").json()["state"] == "paused"
    assert post(alice_client, f"/backfills/{backfill_id}/pause").json()["state"] == "paused"  # again: no change
    assert post(alice_client, f"/backfills/{backfill_id}/unpause").json()["state"] == "running"
    doc = post(alice_client, f"/backfills/{backfill_id}/cancel").json()
    assert doc["state"] == "cancelled"
    assert doc["cancelled"] == 3
    assert doc["runs"]["pending"] == 0
    assert post(alice_client, f"/backfills/{backfill_id}/unpause").status_code == 409
    assert list(AuditLog.objects.filter(action__startswith="backfill_").order_by("id").values_list("action", "username", "prior_state", "new_state")) == [
        ("backfill_create", "alice", "", "running"),
        ("backfill_pause", "alice", "running", "paused"),
        ("backfill_unpause", "alice", "paused", "running"),
        ("backfill_cancel", "alice", "running", "cancelled"),
    ]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"from": "someday", "to": "2026-03-30"}, "from"),
        ({"from": "2026-03-28", "to": "2026-02-30"}, "to"),
        ({"from": "2026-03-30", "to": "2026-03-28"}, "from"),
        ({**BODY, "reprocess": "everything"}, "reprocess"),
        ({**BODY, "max_active_runs": 0}, "max_active_runs"),
        ({**BODY, "max_active_runs": True}, "max_active_runs"),
        ({**BODY, "conf": [1]}, "conf"),
        ({"from": "2026-03-28\u0000", "to": "2026-03-30"}, "from"),
        ({"from": "0001-01-01", "to": "2026-03-30"}, "from"),
        ({"from": "2020-01-01", "to": "2026-03-30"}, "to"),
        ({"to": "2026-03-30"}, "from"),
        ({**BODY, "surprise": 1}, "surprise"),
    ],
)
def test_a_bad_argument_is_a_400_naming_it_and_creates_nothing(alice_client, dag, body, named):
    response = post(alice_client, "/dags/etl/backfills", body)
    assert response.status_code == 400, response.content
    assert named in response.json()["error"]
    assert not Backfill.objects.exists()
    assert not DagRun.objects.exists()


def test_a_dag_without_a_schedule_is_a_400(alice_client):
    chain_dag("manual_only")
    response = post(alice_client, "/dags/manual_only/backfills", BODY)
    assert response.status_code == 400
    assert "no schedule" in response.json()["error"]


def test_unknown_dag_or_backfill_is_a_404(alice_client, dag):
    assert post(alice_client, "/dags/nope/backfills", BODY).status_code == 404
    assert alice_client.get("/api/v1/backfills/999999").status_code == 404
    assert alice_client.get("/api/v1/backfills/abc").status_code == 404
    assert alice_client.get("/api/v1/backfills/" + "9" * 40).status_code == 404
    assert post(alice_client, "/backfills/999999/cancel").status_code == 404


def test_acting_needs_the_trigger_permission(bob_client, alice_client, dag):
    assert post(bob_client, "/dags/etl/backfills", BODY).status_code == 403
    assert not Backfill.objects.exists()
    backfill_id = post(alice_client, "/dags/etl/backfills", BODY).json()["id"]
    for action in ("pause", "unpause", "cancel"):
        assert post(bob_client, f"/backfills/{backfill_id}/{action}").status_code == 403
    assert Backfill.objects.get().state == "running"
    assert bob_client.get(f"/api/v1/backfills/{backfill_id}").status_code == 200  # reading needs only a login


def test_it_needs_a_login(anonymous_client, dag):
    assert post(anonymous_client, "/dags/etl/backfills", BODY).status_code == 401
    assert anonymous_client.get("/api/v1/backfills/1").status_code == 401


def test_the_run_document_says_which_backfill_a_run_belongs_to(alice_client, dag):
    from orchestrator.engine.scheduler import schedule_once

    backfill_id = post(alice_client, "/dags/etl/backfills", {**BODY, "max_active_runs": 1}).json()["id"]
    schedule_once()
    run = DagRun.objects.get(backfill_id=backfill_id)
    doc = alice_client.get(f"/api/v1/dags/etl/runs/{run.run_id}").json()
    assert (doc["run_type"], doc["backfill_id"]) == ("backfill", backfill_id)
    listed = alice_client.get("/api/v1/dags/etl/runs").json()["runs"][0]
    assert (listed["run_type"], listed["backfill_id"]) == ("backfill", backfill_id)


@pytest.fixture
def trigger_only_client(db):
    """May trigger runs, may not act on task instances."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user("tess", "tess@example.com", "pw")
    user.user_permissions.add(Permission.objects.get(codename="trigger_dagrun", content_type__app_label="orchestrator"))
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))
    return client


@pytest.mark.parametrize("reprocess", ["failed", "completed"])
def test_reprocessing_also_needs_the_permission_to_act_on_tasks(trigger_only_client, alice_client, dag, reprocess):
    """A backfill that re-runs runs clears their tasks: it needs orchestrator.change_taskinstance
    as well as orchestrator.trigger_dagrun; one that only creates runs does not."""
    for dry_run in (False, True):
        response = post(trigger_only_client, "/dags/etl/backfills", {**BODY, "reprocess": reprocess, "dry_run": dry_run})
        assert response.status_code == 403
        assert "orchestrator.change_taskinstance" in response.json()["error"]
    assert not Backfill.objects.exists()
    assert post(trigger_only_client, "/dags/etl/backfills", {**BODY, "reprocess": "none"}).status_code == 201
    assert post(alice_client, "/dags/etl/backfills", {**BODY, "reprocess": reprocess}).status_code == 201
