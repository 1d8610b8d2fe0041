"""Actions the console relies on: mark failed stops a held task, bulk actions, CLI and admin edits audited."""
from __future__ import annotations

import getpass

import pytest
from django.core.management import call_command

from orchestrator.models import AuditLog, TaskAttempt
from orchestrator.operations import actions
from tests.api.factories import chain_dag, fail_until_failed, instance, make_run, start

pytestmark = pytest.mark.django_db


def test_mark_failed_on_a_queued_or_running_task_fences_it_and_records_the_context(alice):
    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    actions.mark_failed(ti, alice, note="stop it")
    ti = instance(run, "extract")
    assert ti.state == "failed"
    assert ti.last_failure_context["reason"] == "manual_mark_failed"
    assert ti.last_failure_context["metadata"]["stop"] is True
    assert TaskAttempt.objects.get(task_instance=ti).state == "failed"


def test_mark_failed_loses_to_a_worker_that_changed_the_task_first(alice):
    from orchestrator.exceptions import Conflict

    run = make_run(chain_dag("etl"))
    stale = start(run, "extract")
    actions.mark_failed(instance(run, "extract"), alice)
    with pytest.raises(Conflict):
        actions.mark_failed(stale, alice)


def test_act_on_many_reports_refusals_and_goes_on(alice):
    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract")
    busy = make_run(chain_dag("other"))
    start(busy, "extract")
    done, errors = actions.act_on_many("clear", [instance(busy, "extract"), instance(run, "extract")], alice, note="n")
    assert done == [f"etl/{run.run_id}/extract"]
    assert len(errors) == 1
    assert "while it is running" in errors[0]


def test_the_cli_trigger_is_audited(capsys):
    """Who: the operating-system user who ran the command (no Django user), by way of "cli"."""
    chain_dag("etl")
    call_command("trigger_dag", "etl")
    entry = AuditLog.objects.get()
    assert (entry.action, entry.username, entry.user, entry.details["triggered_by"]) == ("trigger", getpass.getuser(), None, "cli")
    assert capsys.readouterr().out.strip() == entry.run_id


def test_admin_edits_of_dags_and_tasks_are_audited(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "x")
    client.force_login(root)
    dag = chain_dag("etl", task_ids=("extract",))
    task = dag.tasks.get()
    response = client.post(
        f"/admin/orchestrator/task/{task.pk}/change/",
        {
            "task_id": "extract", "python_callable": "tests.api.factories.noop", "bash_command": "", "op_kwargs": "{}",
            "upstream": "", "trigger_rule": "all_success", "retries": "3", "execution_timeout": "", "queue": "",
            "args": "{}", "position": "0",
            "deadline_definitions-TOTAL_FORMS": "0", "deadline_definitions-INITIAL_FORMS": "0",
        },
    )
    errors = response.context["adminform"].form.errors if response.status_code == 200 else None
    assert response.status_code == 302, errors
    entry = AuditLog.objects.get(action="admin_change_task")
    assert entry.username == "root"
    assert entry.dag_id == "etl"
    assert "retries" in entry.details["fields"]


def test_the_admin_links_to_the_console_and_back(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "x")
    client.force_login(root)
    html = client.get("/admin/").content.decode()
    assert 'id="console-link" href="/"' in html
    assert "table-layout: fixed" in html
    assert 'href="/admin/"' in client.get("/").content.decode()


def test_favicon_does_not_404(anonymous_client):
    response = anonymous_client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("favicon.svg")


@pytest.fixture
def web_host_an_hour_fast(monkeypatch):
    """This machine's clock an hour ahead of the database's (the shared clock measures again)."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from orchestrator.foundation import clock

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's clock is this machine's")
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=1))
    clock._offset = None
    yield
    clock._offset = None


def test_an_action_and_its_audit_entry_keep_the_shared_clocks_time(alice, web_host_an_hour_fast):
    """The end date an action writes and the audit entry's time are the database's, not the
    web host's: the engine and the pages compare them with the times workers wrote."""
    from orchestrator.foundation.clock import db_now

    run = make_run(chain_dag("etl"))
    entry = actions.mark_failed(instance(run, "extract"), alice)
    database = db_now()
    assert abs((AuditLog.objects.get(pk=entry.pk).at - database).total_seconds()) < 60
    assert abs((instance(run, "extract").end_date - database).total_seconds()) < 60


def test_a_circuit_operated_by_hand_is_audited_once_on_the_shared_clock(alice, web_host_an_hour_fast):
    from orchestrator.engine import circuits
    from orchestrator.foundation.clock import db_now

    circuit = circuits.get("payments")
    entry = actions.operate_circuit(circuit, "open", alice, note="downstream is down")
    circuit.refresh_from_db()
    assert circuit.state == "open"
    assert abs((circuit.opened_at - db_now()).total_seconds()) < 60
    assert AuditLog.objects.get() == entry
    assert (entry.action, entry.username, entry.prior_state, entry.new_state) == ("circuit_open", "alice", "closed", "open")
    assert entry.details == {"circuit": "payments", "note": "downstream is down"}
