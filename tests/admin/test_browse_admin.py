"""Runs, task instances, attempts, the audit log and deadlines can be browsed in the admin, not edited."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from deadlines.models import Deadline
from orchestrator.models import AuditLog, Dag, DagRun, TaskAttempt, TaskInstance

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)


@pytest.fixture
def history() -> dict[str, object]:
    dag = Dag.objects.create(dag_id="browse")
    run = DagRun.objects.create(dag=dag, run_id="manual__x", logical_date=NOW, queued_at=NOW)
    instance = TaskInstance.objects.create(dag_run=run, task_id="t", state="failed", try_number=1)
    attempt = TaskAttempt.objects.create(
        task_instance=instance, attempt_token=1, try_number=1, infrastructure_try_number=0, queued_at=NOW, state="failed",
        context={"category": "application", "reason": "task_exception", "source": "worker", "metadata": {}},
    )
    log = AuditLog.objects.create(username="admin", action="clear", dag_id="browse", run_id=run.run_id, task_id="t")
    deadline = Deadline.objects.create(dag_run=run, reference="dagrun_queued_at", callback="notifier:log", need_by=NOW)
    return {"dagrun": run, "taskinstance": instance, "taskattempt": attempt, "auditlog": log, "deadline": deadline}


@pytest.mark.parametrize("model", ["dagrun", "taskinstance", "taskattempt", "auditlog", "deadline"])
def test_it_lists_and_shows_but_does_not_edit(admin_client, history, model: str) -> None:
    """The list and the detail page load; there is no add page and the detail page has no save button."""
    app = "deadlines" if model == "deadline" else "orchestrator"
    obj = history[model]
    assert admin_client.get(f"/admin/{app}/{model}/").status_code == 200
    detail = admin_client.get(f"/admin/{app}/{model}/{obj.pk}/change/")
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()
    assert admin_client.get(f"/admin/{app}/{model}/add/").status_code == 403


def test_a_circuits_tunables_edited_here_are_audited(admin_client) -> None:
    from orchestrator.models import Circuit

    circuit = Circuit.objects.create(name="payments")
    form = {"name": "payments", "window": "120", "min_attempts": "", "failure_rate": "", "cooldown": "", "ramp": ""}
    response = admin_client.post(f"/admin/orchestrator/circuit/{circuit.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    entry = AuditLog.objects.get()
    assert (entry.action, entry.username, entry.details) == ("admin_change_circuit", "admin", {"circuit": "payments", "fields": ["window"]})
