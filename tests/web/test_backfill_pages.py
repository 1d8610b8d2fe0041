"""The backfill form's preview, the backfill page and its buttons, and the retry budget verdicts on the DAG page."""
from __future__ import annotations

import pytest

from deadlines.models import DeadlineDefinition
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import AuditLog, Backfill, DagRun
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db

FORM = {"from": "2026-03-28", "to": "2026-03-30", "reprocess": "none", "max_active_runs": "2", "conf": ""}


@pytest.fixture
def dag():
    dag = chain_dag("etl")
    dag.schedule, dag.timezone = "@daily", "Europe/Amsterdam"
    dag.save()
    return dag


def test_the_dag_page_has_the_form(alice_client, bob_client, dag):
    assert 'id="backfill"' in alice_client.get("/dags/etl/").content.decode()
    page = bob_client.get("/dags/etl/").content.decode()
    assert "Backfilling needs the permission" in page
    assert "Preview backfill" not in page


def test_the_preview_shows_each_date_and_creates_nothing(alice_client, dag):
    response = alice_client.post("/dags/etl/backfill", {**FORM, "step": "preview"})
    page = response.content.decode()
    assert response.status_code == 200
    assert page.count('data-action="create"') == 3
    assert "2026-03-29 00:00" in page
    assert "CEST" in page
    assert "Create backfill (3 runs)" in page
    assert not Backfill.objects.exists()


def test_confirming_creates_it_and_shows_its_page(alice_client, dag):
    response = alice_client.post("/dags/etl/backfill", {**FORM, "step": "create"})
    backfill = Backfill.objects.get()
    assert response.status_code == 303
    assert response["Location"] == f"/backfills/{backfill.pk}/"
    assert (backfill.created_by, backfill.max_active_runs) == ("alice", 2)
    schedule_once()
    page = alice_client.get(f"/backfills/{backfill.pk}/").content.decode()
    assert "2 running" in page
    assert "1 pending" in page
    assert 'id="backfill-pause"' in page
    run = DagRun.objects.filter(backfill=backfill).first()
    run_page = alice_client.get(f"/dags/etl/runs/{run.run_id}/").content.decode()
    assert f"backfill #{backfill.pk}" in run_page
    grid = alice_client.get("/dags/etl/").content.decode()
    assert f"(backfill #{backfill.pk})" in grid


def test_a_bad_field_comes_back_on_the_form_naming_it(alice_client, dag):
    response = alice_client.post("/dags/etl/backfill", {**FORM, "to": "2026-02-30<script>", "step": "create"})
    page = response.content.decode()
    assert response.status_code == 400
    assert "to: not an ISO 8601" in page
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert not Backfill.objects.exists()


def test_the_buttons_pause_unpause_and_cancel(alice_client, bob_client, dag):
    alice_client.post("/dags/etl/backfill", {**FORM, "step": "create"})
    backfill = Backfill.objects.get()
    assert bob_client.post(f"/backfills/{backfill.pk}/pause").status_code == 403
    for action, state in (("pause", "paused"), ("unpause", "running"), ("cancel", "cancelled")):
        assert alice_client.post(f"/backfills/{backfill.pk}/{action}").status_code == 303
        backfill.refresh_from_db()
        assert backfill.state == state
    assert alice_client.post(f"/backfills/{backfill.pk}/pause").status_code == 409
    assert AuditLog.objects.filter(action="backfill_cancel", username="alice").exists()


def test_pages_need_a_login(anonymous_client, dag):
    assert anonymous_client.get("/backfills/1/").status_code == 302
    assert anonymous_client.post("/dags/etl/backfill", FORM).status_code == 302


def test_the_dag_page_shows_each_retry_budget_against_its_deadline(alice_client, dag):
    dag.default_args = {**dag.default_args, "retries": 3, "execution_timeout": 60, "retry_delay": 30, "retry_max_delay": 120}
    dag.save()
    DeadlineDefinition.objects.create(dag=dag, reference="dagrun_queued_at", interval=400, callback="notifier:log")
    page = alice_client.get("/dags/etl/").content.decode()
    assert 'id="retry-budget"' in page
    assert page.count("can miss") == 3  # each of the three tasks: 450 s against 400 s
    assert "450 s" in page
    assert "400 s" in page


@pytest.mark.parametrize("step", ["preview", "create"])
def test_the_form_refuses_to_reprocess_without_the_permission_to_act_on_tasks(db, dag, step):
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user("tess", "tess@example.com", "pw")
    user.user_permissions.add(Permission.objects.get(codename="trigger_dagrun", content_type__app_label="orchestrator"))
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))
    response = client.post("/dags/etl/backfill", {**FORM, "reprocess": "completed", "step": step})
    assert response.status_code == 403
    assert "orchestrator.change_taskinstance" in response.content.decode()
    assert not Backfill.objects.exists()
    assert client.post("/dags/etl/backfill", {**FORM, "step": step}).status_code in (200, 303)
