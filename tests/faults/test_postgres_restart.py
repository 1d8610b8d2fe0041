"""PostgreSQL stopped under a running system, then started again: nothing is lost or run twice.

One task ends a few seconds into the outage, another later in it: both outcomes wait in the
worker's spool and are delivered when the database is back; each task ran once, on its first
try, with nothing charged to either budget, and the run goes on to the downstream task. The
database is a cluster of the test's own (`private_postgres.py`), never the machine's.
"""
from __future__ import annotations

import json
import os
import time
import uuid

import pytest
import yaml

from tests.conftest import wait_until
from tests.faults.private_postgres import PrivatePostgres, Processes, query

pytestmark = [pytest.mark.integration]

OUTAGE_SECONDS = float(os.environ.get("TEST_POSTGRES_OUTAGE_SECONDS", "40"))  # longer than the old ~25 s limit


@pytest.mark.timeout(OUTAGE_SECONDS + 600)
def test_a_postgres_restart_loses_no_outcome_and_charges_nothing(tmp_path):
    cluster = PrivatePostgres()
    processes: Processes | None = None
    try:
        cluster.start()
        queue = f"restart-{uuid.uuid4().hex[:8]}"
        processes = Processes(cluster.engine_environment(tmp_path / "spool"))
        processes.run("migrate", "--no-input")
        windows = tmp_path / "windows"
        window = "tests.worker.tasks.window"
        spec = {
            "dag_id": "restart",
            "default_args": {"queue": queue, "retries": 0},
            "tasks": [
                {"task_id": "short", "python_callable": window, "op_kwargs": {"path": str(windows), "seconds": 3}},
                {"task_id": "long", "python_callable": window, "op_kwargs": {"path": str(windows), "seconds": 15}},
                {"task_id": "after", "python_callable": "tests.worker.tasks.succeed", "upstream": ["short"]},
            ],
        }
        (tmp_path / "dag.yaml").write_text(yaml.safe_dump(spec))
        processes.run("import_dags", str(tmp_path / "dag.yaml"))
        worker = processes.start("run_worker", queue, "--concurrency", "4")
        scheduler = processes.start("run_scheduler")
        processes.run("trigger_dag", "restart")

        def states() -> dict[str, tuple]:
            rows = query(
                cluster.url,
                "SELECT task_id, state, try_number, infrastructure_try_number,"
                " (SELECT count(*) FROM orchestrator_taskattempt a WHERE a.task_instance_id = ti.id)"
                " FROM orchestrator_taskinstance ti",
            )
            return {row[0]: row[1:] for row in rows}

        wait_until(lambda: sum(s[0] == "running" for s in states().values()) == 2, timeout=60, message="both running")
        cluster.stop()
        try:
            time.sleep(OUTAGE_SECONDS)
            assert worker.poll() is None, "a process died in the outage"
            assert scheduler.poll() is None, "a process died in the outage"
        finally:
            cluster.start()
        wait_until(lambda: states().get("after", ("",))[0] == "success", timeout=120, message="the run to go on after the restart")
        final = states()
        for task_id, row in final.items():
            assert row == ("success", 1, 0, 1), (task_id, row)
        wait_until(lambda: query(cluster.url, "SELECT state FROM orchestrator_dagrun")[0][0] == "success", timeout=60, message="the run to succeed")
        starts = sorted(e["task_id"] for e in map(json.loads, windows.read_text().splitlines()) if e["event"] == "start")
        assert starts == ["long", "short"], "a task ran twice (or not at all)"
    finally:
        if processes is not None:
            processes.close()
        cluster.close()
