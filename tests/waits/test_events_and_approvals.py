"""Events and approvals complete waiting tasks through the API and the CLI; operators' clear and
marks work on waiting tasks; the gauge counts them."""
from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import AuditLog, Dag, DagRun, Task, TaskInstance, TaskWait

pytestmark = pytest.mark.django_db(transaction=True)


def _dag(wait_for: dict, *, expand: dict | None = None, **default_args) -> Dag:
    dag = Dag.objects.create(dag_id=f"waits-{time.monotonic_ns()}", default_args={"queue": "nobody-listens", **default_args})
    Task.objects.create(dag=dag, task_id="wait", wait_for=wait_for, expand=expand, position=0)
    return dag


def _waiting(dag: Dag) -> DagRun:
    run = create_manual_run(dag)
    schedule_once()
    assert set(TaskInstance.objects.filter(dag_run=run).values_list("state", flat=True)) == {"up_for_reschedule"}
    return run


def _ti(run: DagRun, map_index: int = -1) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id="wait", map_index=map_index)


def _post(client: Client, url: str, body: dict) -> tuple[int, dict]:
    response = client.post(url, json.dumps(body), content_type="application/json")
    return response.status_code, response.json()


def _task_url(run: DagRun, action: str) -> str:
    return f"/api/v1/dags/{run.dag.dag_id}/runs/{run.run_id}/tasks/wait/{action}"


# --- events ---------------------------------------------------------------------------------------


def test_a_targeted_event_completes_the_task_with_its_payload_and_is_audited(alice_client):
    run = _waiting(_dag({"event": {"name": "orders_landed"}}))
    status, body = _post(alice_client, _task_url(run, "events"), {"name": "orders_landed", "payload": {"rows": 12}})
    assert status == 200
    (doc,) = body["task_instances"]
    assert doc["state"] == "success"
    assert doc["result"] == {"rows": 12}
    assert doc["waiting_for"] is None
    entry = AuditLog.objects.get(action="event")
    assert entry.username == "alice"
    assert entry.details["event"] == "orders_landed"
    assert entry.new_state == "success"


def test_an_event_the_task_does_not_wait_for_is_409_and_changes_nothing(alice_client):
    run = _waiting(_dag({"event": {"name": "orders_landed"}}))
    status, body = _post(alice_client, _task_url(run, "events"), {"name": "something_else", "payload": 1})
    assert status == 409
    assert "not waiting for the event" in body["error"]
    ti = _ti(run)
    assert ti.state == "up_for_reschedule"
    assert ti.result is None
    assert not AuditLog.objects.filter(action="event").exists()
    status, _ = _post(alice_client, _task_url(run, "events"), {"name": "orders_landed"})
    assert status == 200
    status, _ = _post(alice_client, _task_url(run, "events"), {"name": "orders_landed"})
    assert status == 409  # once only


def test_an_event_payload_over_the_result_size_is_400(alice_client, settings):
    settings.ORCHESTRATOR_RESULT_MAX_BYTES = 100
    run = _waiting(_dag({"event": {"name": "big"}}))
    status, body = _post(alice_client, _task_url(run, "events"), {"name": "big", "payload": "x" * 500})
    assert status == 400
    assert "ORCHESTRATOR_RESULT_MAX_BYTES" in body["error"]
    assert _ti(run).state == "up_for_reschedule"


def test_an_event_needs_the_trigger_permission(bob_client):
    run = _waiting(_dag({"event": {"name": "orders_landed"}}))
    status, _ = _post(bob_client, _task_url(run, "events"), {"name": "orders_landed"})
    assert status == 403
    assert _ti(run).state == "up_for_reschedule"


def test_a_broadcast_completes_every_waiting_task_of_that_name_or_of_one_dag(alice_client):
    first, second = _dag({"event": {"name": "landed"}}), _dag({"event": {"name": "landed"}})
    other = _dag({"event": {"name": "other"}})
    runs = [_waiting(first), _waiting(second), _waiting(other)]
    status, body = _post(alice_client, "/api/v1/events", {"name": "landed", "payload": "x", "dag_id": first.dag_id})
    assert status == 200
    assert body["delivered"] == [{"dag_id": first.dag_id, "run_id": runs[0].run_id, "task_id": "wait", "map_index": -1}]
    status, body = _post(alice_client, "/api/v1/events", {"name": "landed"})
    assert status == 200
    assert [d["dag_id"] for d in body["delivered"]] == [second.dag_id]
    status, body = _post(alice_client, "/api/v1/events", {"name": "landed"})
    assert status == 200
    assert body["delivered"] == []
    assert _ti(runs[2]).state == "up_for_reschedule"


def test_an_event_to_one_mapped_instance(alice_client):
    run = _waiting(_dag({"event": {"name": "part"}}, expand={"part": [1, 2, 3]}))
    status, body = _post(alice_client, _task_url(run, "events"), {"name": "part", "payload": "one", "map_index": 1})
    assert status == 200
    states = {doc["map_index"]: doc["state"] for doc in body["task_instances"]}
    assert states == {0: "up_for_reschedule", 1: "success", 2: "up_for_reschedule"}


def test_send_event_command_targeted_and_broadcast(capsys):
    dag = _dag({"event": {"name": "landed"}})
    first, second = _waiting(dag), _waiting(dag)
    call_command("send_event", "landed", "--payload", '{"n": 1}', "--dag", dag.dag_id, "--run", first.run_id, "--task", "wait")
    assert capsys.readouterr().out.strip() == f"{dag.dag_id} {first.run_id} wait"
    assert _ti(first).result == {"n": 1}
    with pytest.raises(CommandError, match="not waiting"):
        call_command("send_event", "landed", "--dag", dag.dag_id, "--run", first.run_id, "--task", "wait")
    call_command("send_event", "landed")
    assert capsys.readouterr().out.strip() == f"{dag.dag_id} {second.run_id} wait"
    call_command("send_event", "landed")  # reaches none: exit 0, nothing printed
    assert capsys.readouterr().out == ""
    with pytest.raises(CommandError, match="not JSON"):
        call_command("send_event", "landed", "--payload", "{nope")


def test_send_event_command_finds_the_dag_of_a_run_named_alone(capsys):
    dag, other = _dag({"event": {"name": "landed"}}), _dag({"event": {"name": "landed"}})
    run = _waiting(dag)
    call_command("send_event", "landed", "--run", run.run_id, "--task", "wait")
    assert capsys.readouterr().out.strip() == f"{dag.dag_id} {run.run_id} wait"
    with pytest.raises(CommandError, match="no DAG has a run 'nope'"):
        call_command("send_event", "landed", "--run", "nope", "--task", "wait")
    twin = _waiting(other)
    DagRun.objects.filter(pk=twin.pk).update(run_id="shared")
    DagRun.objects.filter(pk=_waiting(dag).pk).update(run_id="shared")
    with pytest.raises(CommandError, match="is a run of more than one DAG .*: name the DAG"):
        call_command("send_event", "landed", "--run", "shared", "--task", "wait")
    call_command("send_event", "landed", "--dag", other.dag_id, "--run", "shared", "--task", "wait")
    assert capsys.readouterr().out.strip() == f"{other.dag_id} shared wait"
    with pytest.raises(CommandError, match="go together"):
        call_command("send_event", "landed", "--run", "shared")


# --- approvals ------------------------------------------------------------------------------------


@pytest.fixture
def approver(db) -> Client:
    user = User.objects.create_user("carol", "carol@example.com", "x")
    user.user_permissions.add(Permission.objects.get(codename="approve_taskinstance", content_type__app_label="orchestrator"))
    client = Client()
    client.force_login(user)
    client.user = user  # type: ignore[attr-defined]
    return client


def test_approve_succeeds_with_who_and_the_note_and_is_audited(approver):
    run = _waiting(_dag({"approval": {"message": "Publish the report?"}}))
    status, body = _post(approver, _task_url(run, "approve"), {"note": "looks right"})
    assert status == 200
    (doc,) = body["task_instances"]
    assert doc["state"] == "success"
    assert doc["result"] == {"approved_by": "carol", "note": "looks right"}
    entry = AuditLog.objects.get(action="approve")
    assert entry.username == "carol"
    assert entry.details["note"] == "looks right"


def test_reject_fails_the_task_not_retried(approver):
    run = _waiting(_dag({"approval": {"message": "Publish?"}}, retries=3))
    status, body = _post(approver, _task_url(run, "reject"), {"note": "numbers are off"})
    assert status == 200
    ti = _ti(run)
    assert ti.state == "failed"
    assert ti.try_number == 1
    assert (ti.last_failure_context["category"], ti.last_failure_context["reason"]) == ("user_action", "rejected")
    assert AuditLog.objects.get(action="reject").details["note"] == "numbers are off"


def test_approval_needs_the_permission_then_the_group(alice_client, approver):
    run = _waiting(_dag({"approval": {"message": "Publish?", "approvers": ["finance"]}}))
    status, body = _post(alice_client, _task_url(run, "approve"), {})
    assert status == 403
    assert "approve_taskinstance" in body["error"]
    status, body = _post(approver, _task_url(run, "approve"), {})
    assert status == 403
    assert "finance" in body["error"]
    assert _ti(run).state == "up_for_reschedule"
    approver.user.groups.add(Group.objects.create(name="finance"))
    status, _ = _post(approver, _task_url(run, "approve"), {})
    assert status == 200
    assert _ti(run).state == "success"


def test_a_decision_on_a_task_not_waiting_for_an_approval_is_409(approver):
    run = _waiting(_dag({"event": {"name": "x"}}))
    status, _ = _post(approver, _task_url(run, "reject"), {})
    assert status == 409
    assert _ti(run).state == "up_for_reschedule"


def test_the_approvals_page_lists_waiting_approvals_oldest_first(approver):
    first = _waiting(_dag({"approval": {"message": "First?"}}))
    second = _waiting(_dag({"approval": {"message": "Second?"}}))
    page = approver.get("/approvals/").content.decode()
    assert page.index(first.dag.dag_id) < page.index(second.dag.dag_id)
    assert "First?" in page


def test_the_task_page_shows_the_message_and_the_decision_to_those_allowed(approver, alice_client):
    run = _waiting(_dag({"approval": {"message": "Publish the numbers?", "approvers": []}}))
    url = f"/dags/{run.dag.dag_id}/runs/{run.run_id}/tasks/wait"
    page = approver.get(url).content.decode()
    assert "Publish the numbers?" in page
    assert 'id="approval-approve"' in page
    page = alice_client.get(url).content.decode()
    assert "Publish the numbers?" in page
    assert 'id="approval-approve"' not in page


# --- operators and the gauge -------------------------------------------------------------------------


def test_clear_and_marks_work_on_a_waiting_task(alice_client):
    run = _waiting(_dag({"event": {"name": "never"}}, retries=1))
    status, body = _post(alice_client, _task_url(run, "mark_success"), {})
    assert status == 200
    assert body["task_instances"][0]["state"] == "success"
    assert body["task_instances"][0]["attempts"][-1]["state"] == "success"
    assert not TaskWait.objects.filter(task_instance__dag_run=run).exists()

    run = _waiting(_dag({"event": {"name": "never"}}))
    status, body = _post(alice_client, _task_url(run, "mark_failed"), {})
    assert status == 200
    assert body["task_instances"][0]["state"] == "failed"
    assert body["task_instances"][0]["attempts"][-1]["context"]["reason"] == "manual_mark_failed"

    run = _waiting(_dag({"event": {"name": "again"}}))
    status, body = _post(alice_client, _task_url(run, "clear"), {})
    assert status == 200
    schedule_once()  # the cleared task waits again, its wait begun afresh
    ti = _ti(run)
    assert ti.state == "up_for_reschedule"
    assert ti.attempts.count() == 2
    assert TaskWait.objects.get(task_instance=ti).attempt_token == ti.attempt_token


def test_the_gauge_counts_waiting_tasks_by_kind(alice_client):
    _waiting(_dag({"event": {"name": "x"}}))
    _waiting(_dag({"event": {"name": "y"}}))
    _waiting(_dag({"approval": {"message": "?"}}))
    text = alice_client.get("/metrics").content.decode()
    assert 'orchestrator_waiting_tasks{kind="event"} 2.0' in text
    assert 'orchestrator_waiting_tasks{kind="approval"} 1.0' in text
    assert 'orchestrator_waiting_tasks{kind="reschedule"} 0.0' in text
