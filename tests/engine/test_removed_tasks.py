"""A task removed from its DAG while it waits to run (scheduled, or up_for_retry) becomes
`removed`: it is not dispatched to fail for want of a definition and spend the user's retries."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.utils import timezone

from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import Dag, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = reporting.WorkerInfo(hostname="h", worker_name="w", pid=1)


def import_spec(tmp_path, tasks: list[dict]) -> Dag:
    path = tmp_path / "dag.yaml"
    path.write_text(yaml.safe_dump({"dag_id": "shrinking", "default_args": {"retries": 3, "retry_delay": 3600, "retry_jitter": "none"}, "tasks": tasks}))
    call_command("import_dags", str(path), stdout=StringIO())
    return Dag.objects.get(dag_id="shrinking")


def both(tmp_path) -> Dag:
    return import_spec(tmp_path, [{"task_id": "keep", "bash_command": "sleep 60"}, {"task_id": "drop", "bash_command": "false"}])


@pytest.mark.parametrize("waiting", ["scheduled", "up_for_retry"])
def test_a_task_removed_while_it_waits_to_run_is_removed_not_dispatched(tmp_path, waiting):
    run = create_manual_run(both(tmp_path))
    drop = TaskInstance.objects.get(dag_run=run, task_id="drop")
    if waiting == "up_for_retry":
        assert reporting.claim(drop.pk, drop.attempt_token, WORKER)
        assert reporting.mark_running(drop.pk, drop.attempt_token)
        context = ExecutionContext.of(Reason.NONZERO_EXIT, Source.WORKER, exit_code=1)
        reporting.report_failure(drop.pk, drop.attempt_token, context, fingerprint="abc", now=timezone.now())
        TaskInstance.objects.filter(pk=drop.pk).update(next_retry_at=timezone.now() + timedelta(hours=1))
    else:
        TaskInstance.objects.filter(pk=drop.pk).update(state="scheduled", next_retry_at=timezone.now() + timedelta(hours=1))
    drop.refresh_from_db()
    assert drop.state == waiting
    before = (drop.try_number, drop.attempt_token, drop.attempts.count())

    import_spec(tmp_path, [{"task_id": "keep", "bash_command": "sleep 60"}])  # "drop" is gone
    schedule_once()

    drop.refresh_from_db()
    assert drop.state == TaskState.REMOVED
    assert drop.end_date is not None
    assert (drop.try_number, drop.attempt_token, drop.attempts.count()) == before  # nothing dispatched, nothing spent
