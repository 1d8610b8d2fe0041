"""One heartbeat for a worker's many attempts: a thousand and more in one call, on SQLite too
(one OR term per attempt once exceeded SQLite's expression depth), refusals still found."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = r"""
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from orchestrator.engine.reporting import heartbeat_many
from orchestrator.models import Dag, DagRun, TaskInstance

call_command("migrate", verbosity=0)
assert connection.vendor == "sqlite"
dag = Dag.objects.create(dag_id="wide")
run = DagRun.objects.create(dag=dag, run_id="r", logical_date=timezone.now(), queued_at=timezone.now())
TaskInstance.objects.bulk_create(
    TaskInstance(dag_run=run, task_id=f"t{i}", state="running", attempt_token=1) for i in range(N)
)
attempts = list(TaskInstance.objects.values_list("id", "attempt_token"))
assert heartbeat_many(attempts) == set()
assert TaskInstance.objects.filter(heartbeat_at__isnull=True).count() == 0
superseded = attempts[N // 2]
TaskInstance.objects.filter(pk=superseded[0]).update(attempt_token=2)
print(sorted(heartbeat_many(attempts)) == [superseded])
"""


@pytest.mark.parametrize("n", [1200])
def test_a_worker_holding_a_thousand_attempts_heartbeats_on_sqlite(tmp_path, n):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-c", f"N = {n}\n" + SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=110
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.django_db
def test_a_thousand_attempts_in_one_heartbeat_on_this_database():
    from django.utils import timezone

    from orchestrator.engine.reporting import heartbeat_many
    from orchestrator.models import Dag, DagRun, TaskInstance

    dag = Dag.objects.create(dag_id="wide")
    run = DagRun.objects.create(dag=dag, run_id="r", logical_date=timezone.now(), queued_at=timezone.now())
    TaskInstance.objects.bulk_create(TaskInstance(dag_run=run, task_id=f"t{i}", state="running", attempt_token=1) for i in range(1200))
    attempts = list(TaskInstance.objects.values_list("id", "attempt_token"))
    assert heartbeat_many(attempts) == set()
    gone = attempts[700]
    TaskInstance.objects.filter(pk=gone[0]).update(state="failed")
    assert heartbeat_many(attempts) == {gone}
