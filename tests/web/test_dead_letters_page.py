"""Dead letters grouped by fingerprint, bulk actions, permissions; and the JSON endpoint."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orchestrator.models import AuditLog, TaskInstance
from tests.api.factories import chain_dag, fail, instance, make_run

pytestmark = pytest.mark.django_db


def dead_letter(run, task_id: str = "extract", **kwargs) -> None:
    fail(run, task_id, **kwargs)
    TaskInstance.objects.filter(dag_run=run, task_id=task_id).update(next_retry_at=timezone.now() - timedelta(seconds=1))
    assert fail(run, task_id, **kwargs).state == "dead_letter"


@pytest.fixture
def two_dead():
    dag = chain_dag("etl", retries=9, poison_threshold=2)
    runs = [make_run(dag, at=timezone.now() + timedelta(seconds=i)) for i in range(2)]
    for run in runs:
        dead_letter(run, message="<b>row 7</b> is bad")
    return runs


def test_it_groups_dead_letters_by_fingerprint(bob_client, two_dead):
    html = bob_client.get("/dead-letters/").content.decode()
    assert "same error, 2 tasks" in html
    assert "ValueError: &lt;b&gt;row 7&lt;/b&gt; is bad" in html
    assert "<b>row 7</b>" not in html
    for run in two_dead:
        assert f"/dags/etl/runs/{run.run_id}/tasks/extract" in html
    assert "First seen" in html
    assert "Confirm clear" not in html


def test_bulk_clear_and_mark_failed(alice_client, two_dead):
    html = alice_client.get("/dead-letters/").content.decode()
    assert "Confirm clear" in html
    assert "Confirm mark failed" in html
    response = alice_client.post("/dead-letters/act", {"action": "clear", "fingerprint": "4a7c1d9e02bb", "note": "deployed fix"})
    assert response.status_code == 303
    assert all(instance(run, "extract").state != "dead_letter" for run in two_dead)
    assert [e.details["note"] for e in AuditLog.objects.filter(action="clear")] == ["deployed fix"] * 2


def test_bulk_mark_failed(alice_client, two_dead):
    alice_client.post("/dead-letters/act", {"action": "mark_failed", "fingerprint": "4a7c1d9e02bb"})
    assert [instance(run, "extract").state for run in two_dead] == ["failed", "failed"]


def test_bulk_actions_need_the_permission_and_a_known_action(alice_client, bob_client, two_dead):
    assert bob_client.post("/dead-letters/act", {"action": "clear", "fingerprint": "4a7c1d9e02bb"}).status_code == 403
    assert alice_client.post("/dead-letters/act", {"action": "drop", "fingerprint": "4a7c1d9e02bb"}).status_code == 400
    assert alice_client.get("/dead-letters/act").status_code == 405
    assert not AuditLog.objects.exists()


def test_the_api_serves_the_groups(bob_client, anonymous_client, two_dead):
    doc = bob_client.get("/api/v1/dead_letters").json()
    [group] = doc["dead_letters"]
    assert group["fingerprint"] == "4a7c1d9e02bb"
    assert group["count"] == 2
    assert group["sample_error"] == "ValueError: <b>row 7</b> is bad"
    assert group["first_seen"]
    assert group["last_seen"]
    assert sorted(i["run_id"] for i in group["instances"]) == sorted(r.run_id for r in two_dead)
    assert anonymous_client.get("/api/v1/dead_letters").status_code == 401
    assert "/dead_letters" in bob_client.get("/api/v1/openapi.json").json()["paths"]


def test_its_query_count_is_bounded(bob_client, django_assert_max_num_queries, two_dead):
    with django_assert_max_num_queries(8):
        bob_client.get("/dead-letters/")


def test_clear_all_failed_on_a_run(alice_client, bob_client):
    from tests.api.factories import fail_until_failed

    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract")
    html = alice_client.get(f"/dags/etl/runs/{run.run_id}/").content.decode()
    assert "Confirm clear all failed" in html
    assert "Confirm clear all failed" not in bob_client.get(f"/dags/etl/runs/{run.run_id}/").content.decode()
    assert bob_client.post(f"/dags/etl/runs/{run.run_id}/clear_failed").status_code == 403
    response = alice_client.post(f"/dags/etl/runs/{run.run_id}/clear_failed", {"note": "retry all"})
    assert response.status_code == 303
    assert instance(run, "extract").state != "failed"
    assert AuditLog.objects.get().details["note"] == "retry all"
