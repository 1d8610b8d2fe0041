"""`import_dags` checks each task's retry budget against the deadlines that bound it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.models import Dag
from orchestrator.specs.budget import dag_verdicts
from tests.conftest import ROOT

TIGHT = {
    "dag_id": "settlement",
    "schedule": "0 2 * * *",
    "default_args": {"retries": 3, "execution_timeout": 60, "retry_delay": 30, "retry_max_delay": 120, "retry_jitter": "full", "infrastructure_retry_limit": 2},
    "deadlines": [
        {"reference": "dagrun_queued_at", "interval": 400, "callback": "notifier:log"},
        {"reference": "dagrun_logical_date", "interval": 10, "callback": "notifier:log"},  # does not bound a try
    ],
    "tasks": [
        {"task_id": "extract", "bash_command": "true", "deadlines": [{"reference": "task_started_at", "interval": 450, "callback": "notifier:log"}]},
        {"task_id": "load", "bash_command": "true", "upstream": ["extract"], "execution_timeout": None},  # no timeout: no worst case
    ],
}


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "settlement.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def import_dags(process_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "import_dags", *args],
        env={**process_env, "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "30", "ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY": "10"}, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.django_db(transaction=True)
def test_it_warns_naming_file_dag_task_deadline_and_both_figures_and_still_imports(tmp_path, process_env):
    path = write(tmp_path, TIGHT)
    result = import_dags(process_env, str(path))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {path}: dag 'settlement': task 'extract': DAG deadlines[0] (dagrun_queued_at + 400 s):"
        " the retry budget's worst case 450 s exceeds the deadline's 400 s (the platform budget's worst case adds up to 200 s more)"
    ]
    assert "created settlement" in result.stdout
    assert Dag.objects.filter(dag_id="settlement").exists()


@pytest.mark.django_db(transaction=True)
def test_strict_refuses_it_and_imports_nothing(tmp_path, process_env):
    path = write(tmp_path, TIGHT)
    result = import_dags(process_env, "--strict", str(path))
    assert result.returncode != 0
    assert "nothing imported" in result.stderr
    assert f"{path}: dag 'settlement': task 'extract': DAG deadlines[0] (dagrun_queued_at + 400 s)" in result.stderr
    assert not Dag.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_budget_that_fits_is_imported_quietly_even_under_strict(tmp_path, process_env):
    spec = {**TIGHT, "deadlines": [{"reference": "dagrun_queued_at", "interval": 450, "callback": "notifier:log"}]}
    result = import_dags(process_env, "--strict", str(write(tmp_path, spec)))
    assert result.returncode == 0, result.stderr
    assert "warning:" not in result.stdout + result.stderr


@pytest.mark.django_db
def test_the_dag_in_the_database_gets_the_same_verdicts(tmp_path):
    from io import StringIO

    from django.core.management import call_command

    call_command("import_dags", str(write(tmp_path, TIGHT)), stdout=StringIO())
    verdicts = dag_verdicts(Dag.objects.get(dag_id="settlement"))
    assert [(v.task_id, v.deadline, v.worst_case, v.interval, v.fits) for v in verdicts] == [
        ("extract", "task deadlines[0] (task_started_at + 450 s)", 450, 450, True),
        ("extract", "DAG deadlines[0] (dagrun_queued_at + 400 s)", 450, 400, False),
    ]
