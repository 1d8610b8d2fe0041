"""PostgreSQL stopped under a running system, then started again: nothing is lost or run twice.

It stops the machine's PostgreSQL cluster itself (`pg_ctlcluster ... stop`), so it needs root
and pg_ctlcluster and is skipped without them; it always starts the cluster again.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from django.db import connection

from orchestrator.engine.runs import create_manual_run
from orchestrator.models import DagRun, TaskInstance
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

OUTAGE_SECONDS = float(os.environ.get("TEST_POSTGRES_OUTAGE_SECONDS", "40"))  # longer than the old ~25 s limit
T = "tests.worker.tasks."


def _cluster() -> tuple[str, str] | None:
    if os.geteuid() != 0 or not shutil.which("pg_ctlcluster") or connection.vendor != "postgresql":
        return None
    versions = sorted(p.name for p in Path("/etc/postgresql").glob("*")) if Path("/etc/postgresql").is_dir() else []
    return (versions[-1], "main") if versions else None


def _pg(action: str, cluster: tuple[str, str]) -> None:
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, action, *(["-m", "fast"] if action == "stop" else [])], check=True, timeout=120)


def test_a_postgres_restart_loses_no_outcome_and_charges_nothing(spawn, make_dag, queue_name, tmp_path):
    cluster = _cluster()
    if cluster is None:
        pytest.skip("needs root, pg_ctlcluster and the tests on the local PostgreSQL cluster")
    windows = tmp_path / "w"
    dag = make_dag(
        [
            {"task_id": "short", "python_callable": T + "window", "op_kwargs": {"path": str(windows), "seconds": 3}},
            {"task_id": "long", "python_callable": T + "window", "op_kwargs": {"path": str(windows), "seconds": 15}},
            {"task_id": "after", "python_callable": T + "succeed", "upstream": ["short"]},
        ]
    )
    env = {
        "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.5",
        "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "3",
        "ORCHESTRATOR_REPORT_PATIENCE": "2",
        "ORCHESTRATOR_SPOOL_DIR": str(tmp_path / "spool"),
        "ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2",
    }
    spawn("run_worker", queue_name, "--concurrency", "4", env=env)
    spawn("run_scheduler", env=env)
    run = create_manual_run(dag)
    wait_until(lambda: TaskInstance.objects.filter(dag_run=run, state="running").count() == 2, timeout=30, message="both running")
    connection.close()
    try:
        _pg("stop", cluster)
        time.sleep(OUTAGE_SECONDS)
    finally:
        _pg("start", cluster)
    connection.close()
    wait_until(lambda: _reachable(), timeout=60, message="PostgreSQL back")
    wait_until(lambda: DagRun.objects.get(pk=run.pk).state == "success", timeout=60, message="the run to succeed")
    for ti in TaskInstance.objects.filter(dag_run=run):
        assert (ti.state, ti.try_number, ti.infrastructure_try_number) == ("success", 1, 0), ti.task_id
        assert ti.attempts.count() == 1, ti.task_id
    starts = [line for line in windows.read_text().splitlines() if '"start"' in line]
    assert len(starts) == 2  # short and long ran once each


def _reachable() -> bool:
    try:
        connection.ensure_connection()
        return True
    except Exception:
        connection.close()
        return False
