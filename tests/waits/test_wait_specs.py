"""`wait_for` in DAG files: validated at import (errors name the file, DAG, task and field), a
`dag_run` on a DAG not defined yet is only a warning, and export -> import is a no-op."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from orchestrator.models import Task

pytestmark = pytest.mark.django_db


def _write(tmp_path: Path, tasks: list[dict], **dag) -> Path:
    path = tmp_path / "dag.yaml"
    path.write_text(yaml.safe_dump({"dag_id": "waiting", "tasks": tasks, **dag}))
    return path


@pytest.mark.parametrize(
    ("task", "field", "words"),
    [
        ({"task_id": "w", "wait_for": {"event": {"name": "x"}}, "python_callable": "tests.worker.tasks.succeed"}, "tasks[0]", "exactly one"),
        ({"task_id": "w", "wait_for": {"event": {"name": "x"}, "time": "2026-01-01"}}, "tasks[0].wait_for", "exactly one"),
        ({"task_id": "w", "wait_for": {"sleep": 5}}, "tasks[0].wait_for", "unknown kind"),
        ({"task_id": "w", "wait_for": {"time": "tomorrow"}}, "tasks[0].wait_for.time", "ISO 8601"),
        ({"task_id": "w", "wait_for": {"time_after_logical_date": "1h"}}, "tasks[0].wait_for.time_after_logical_date", "seconds"),
        ({"task_id": "w", "wait_for": {"dag_run": {"dag_id": "bad id!"}}}, "tasks[0].wait_for.dag_run.dag_id", "DAG id"),
        ({"task_id": "w", "wait_for": {"http": {"url": "https://partner.example/ready"}}}, "tasks[0].wait_for.http.url", "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS"),
        ({"task_id": "w", "wait_for": {"http": {"url": "ftp://x"}}}, "tasks[0].wait_for.http.url", "http(s) URL"),
        ({"task_id": "w", "wait_for": {"event": {"name": ""}}}, "tasks[0].wait_for.event.name", "name"),
        ({"task_id": "w", "wait_for": {"approval": {"message": "?", "approvers": "finance"}}}, "tasks[0].wait_for.approval.approvers", "list"),
        ({"task_id": "w", "wait_for": {"event": {"name": "x"}}, "poke_interval": 0.5}, "tasks[0].poke_interval", ">= 1"),
        ({"task_id": "w", "wait_for": {"event": {"name": "x"}}, "wait_timeout": 0}, "tasks[0].wait_timeout", "> 0"),
    ],
)
def test_a_bad_wait_for_is_an_import_error_naming_file_dag_task_and_field(tmp_path: Path, task: dict, field: str, words: str):
    path = _write(tmp_path, [task])
    with pytest.raises(CommandError) as raised:
        call_command("import_dags", str(path))
    message = str(raised.value)
    assert str(path) in message
    assert "waiting" in message
    assert field in message
    assert words in message
    assert not Task.objects.exists()


def test_wait_for_is_not_a_default_arg(tmp_path: Path):
    path = _write(tmp_path, [{"task_id": "w", "wait_for": {"event": {"name": "x"}}}], default_args={"wait_for": {"event": {"name": "y"}}})
    with pytest.raises(CommandError, match="default_args"):
        call_command("import_dags", str(path))


def test_a_dag_run_on_an_unknown_dag_is_a_warning_and_export_import_is_a_no_op(tmp_path: Path, capsys, settings):
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["partner.example"]
    tasks = [
        {"task_id": "upstream", "wait_for": {"dag_run": {"dag_id": "not_yet", "task_id": "publish", "offset": -86400}}},
        {"task_id": "at", "wait_for": {"time": "2026-12-01T06:00:00"}, "poke_interval": 30, "wait_timeout": 3600},
        {"task_id": "later", "wait_for": {"time_after_logical_date": 3600}},
        {"task_id": "ready", "wait_for": {"http": {"url": "https://partner.example/ready", "status": 200, "contains": "ready"}}},
        {"task_id": "landed", "wait_for": {"event": {"name": "orders_landed"}}},
        {"task_id": "ok", "wait_for": {"approval": {"message": "Publish?", "approvers": ["finance"]}}, "upstream": ["landed"]},
    ]
    path = _write(tmp_path, tasks)
    call_command("import_dags", str(path))
    out = capsys.readouterr()
    warnings = [line for line in (out.out + out.err).splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "not_yet" in warnings[0]
    assert "upstream" in warnings[0]
    assert str(path) in warnings[0]
    assert Task.objects.get(task_id="landed").wait_for == {"event": {"name": "orders_landed"}}
    call_command("import_dags", "--strict", str(path))  # still a warning, never an error
    out = capsys.readouterr()
    assert "unchanged" in out.out
    assert [line for line in (out.out + out.err).splitlines() if line.startswith("warning:")] == warnings
    call_command("export_dags", "waiting")
    exported = capsys.readouterr().out
    again = tmp_path / "again.yaml"
    again.write_text(exported)
    call_command("import_dags", str(again))
    assert "unchanged" in capsys.readouterr().out
    (dag,) = yaml.safe_load(exported)
    assert dag["tasks"][1]["wait_for"] == {"time": "2026-12-01T06:00:00"}
