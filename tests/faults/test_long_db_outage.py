"""A metadata database away for minutes, with tasks ending two minutes into the outage.

The test starts a PostgreSQL cluster of its own (initdb into a temporary directory as the
postgres user, on a free port), runs a real scheduler and worker on it, stops the cluster while
six tasks run and starts it again minutes later. Every outcome must survive: each task ran once,
succeeded on its first try, nothing charged to either budget, the scheduler still alive, and the
run went on to its downstream task. It needs root and PostgreSQL's server binaries (skipped
without them), never touches the machine's shared cluster, and takes about
OUTAGE_SECONDS + 90 s (deselect it with `-m "not long_outage"`).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import pytest
import yaml

from tests.conftest import wait_until
from tests.faults.private_postgres import PrivatePostgres, Processes, query

pytestmark = [pytest.mark.integration, pytest.mark.long_outage]

OUTAGE_SECONDS = float(os.environ.get("TEST_LONG_OUTAGE_SECONDS", "180"))
TASKS_END_INTO_OUTAGE = float(os.environ.get("TEST_LONG_OUTAGE_TASKS_END", "120"))
TASKS = 6


@pytest.mark.timeout(OUTAGE_SECONDS + 900)
def test_a_database_outage_of_minutes_loses_no_outcome_and_charges_nothing(tmp_path):
    cluster = PrivatePostgres()
    processes: Processes | None = None
    try:
        cluster.start()
        queue = f"outage-{uuid.uuid4().hex[:8]}"
        env = cluster.engine_environment(
            tmp_path / "spool",
            ORCHESTRATOR_DB_OUTAGE_TOLERANCE=str(int(OUTAGE_SECONDS + 300)),
            ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY="0",
        )
        processes = Processes(env)
        processes.run("migrate", "--no-input")
        windows = tmp_path / "windows"
        seconds = TASKS_END_INTO_OUTAGE + 5  # the outage starts about when the last one started
        spec = {
            "dag_id": "long_outage",
            "default_args": {"queue": queue, "retries": 0},
            "tasks": [
                *({"task_id": f"t{i}", "python_callable": "tests.worker.tasks.window",
                   "op_kwargs": {"path": str(windows), "seconds": seconds}} for i in range(TASKS)),  # fmt: skip
                {"task_id": "after", "python_callable": "tests.worker.tasks.succeed", "upstream": ["t0"]},
            ],
        }
        (tmp_path / "dag.yaml").write_text(yaml.safe_dump(spec))
        processes.run("import_dags", str(tmp_path / "dag.yaml"))
        worker = processes.start("run_worker", queue, "--concurrency", str(TASKS + 2))
        scheduler = processes.start("run_scheduler")
        processes.run("trigger_dag", "long_outage")

        def states() -> dict[str, tuple[Any, ...]]:
            rows = query(
                cluster.url,
                "SELECT task_id, state, try_number, infrastructure_try_number,"
                " (SELECT count(*) FROM orchestrator_taskattempt a WHERE a.task_instance_id = ti.id)"
                " FROM orchestrator_taskinstance ti",
            )
            return {row[0]: row[1:] for row in rows}

        wait_until(lambda: sum(s[0] == "running" for s in states().values()) == TASKS, timeout=180, message="every task running")
        outage_started = time.monotonic()
        cluster.stop()
        try:
            time.sleep(OUTAGE_SECONDS)
            assert worker.poll() is None, "a process died in the outage"
            assert scheduler.poll() is None, "a process died in the outage"
            spooled = list((tmp_path / "spool").glob("*/ti-*.json"))
            assert len(spooled) == TASKS, f"{len(spooled)} of {TASKS} outcomes spooled"
        finally:
            cluster.start()
        outage = time.monotonic() - outage_started
        wait_until(lambda: states().get("after", ("",))[0] == "success", timeout=180, message="the run to go on after the outage")
        # The spool delivers its outcomes one after another: `after` may succeed before the last.
        wait_until(
            lambda: all(s[0] != "running" for s in states().values()), timeout=60, message="every spooled outcome to be delivered"
        )
        final = states()
        for task_id, (state, try_number, infra, attempts) in final.items():
            assert (state, try_number, infra, attempts) == ("success", 1, 0, 1), (task_id, final[task_id])
        wait_until(lambda: query(cluster.url, "SELECT state FROM orchestrator_dagrun")[0][0] == "success", timeout=60, message="the run to succeed")
        events = [json.loads(line) for line in windows.read_text().splitlines()]
        starts = sorted(e["task_id"] for e in events if e["event"] == "start")
        assert starts == sorted(f"t{i}" for i in range(TASKS)), "a task ran twice (or not at all)"
        assert worker.poll() is None
        assert scheduler.poll() is None
        assert not list((tmp_path / "spool").glob("*/ti-*.json")), "an outcome is still waiting in the spool"
        print(f"outage {outage:.0f}s; every outcome delivered after it")
    finally:
        if processes is not None:
            processes.close()
        cluster.close()
