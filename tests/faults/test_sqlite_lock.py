"""SQLite: a writer holding the database's lock for 25 s while a task runs.

Every writer queues behind the lock (SQLite's busy timeout), the worker's heartbeat among them.
The heartbeat waits for it only one interval and keeps the lease in Redis meanwhile, so the
fork server does not kill the task and no scheduler presumes it lost: the task succeeds at try
1, once. Real processes on a SQLite file: migrate, import_dags, trigger_dag, run_worker and
run_scheduler, and a lock taken with BEGIN IMMEDIATE from this test.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, wait_until

pytestmark = [pytest.mark.integration]


def _manage(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.timeout(600)
def test_a_writer_holding_sqlites_lock_for_25_seconds_kills_no_task(tmp_path, private_redis):
    import os

    database = tmp_path / "db.sqlite3"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "locked.yaml").write_text(
        "dag_id: locked\nschedule: null\ndefault_args:\n  queue: sqlite-lock\n  retries: 0\n"
        "tasks:\n  - task_id: long\n    bash_command: 'sleep 30 && echo done'\n"
    )
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{database}",
        "REDIS_URL": private_redis.url,
        "PYTHONPATH": str(ROOT),
        "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.5",
        "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "6",
        "ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2",
        "ORCHESTRATOR_SPOOL_DIR": str(tmp_path / "spool"),
    }
    _manage(env, "migrate", "-v", "0")
    _manage(env, "import_dags", str(dags))
    procs = []
    try:
        for args in (("run_worker", "sqlite-lock"), ("run_scheduler",)):
            with open(tmp_path / f"{args[0]}.log", "w") as log:
                procs.append(subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        _manage(env, "trigger_dag", "locked")
        reader = sqlite3.connect(database, timeout=30)

        def state() -> str | None:
            row = reader.execute("SELECT state FROM orchestrator_taskinstance WHERE task_id = 'long'").fetchone()
            return row[0] if row else None

        wait_until(lambda: state() == "running", timeout=60, message="the task running")
        time.sleep(2)
        writer = sqlite3.connect(database, timeout=30, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # what a large import_dags holds
        time.sleep(25)
        writer.execute("ROLLBACK")
        writer.close()
        wait_until(lambda: state() in ("success", "failed", "scheduled", "up_for_retry"), timeout=60, message="the task to end")
        attempts = reader.execute(
            "SELECT a.kind, a.state, a.context FROM orchestrator_taskattempt a JOIN orchestrator_taskinstance t ON t.id = a.task_instance_id "
            "WHERE t.task_id = 'long' ORDER BY a.attempt_token"
        ).fetchall()
        found = [(k, s, json.loads(c or "null")) for k, s, c in attempts]
        assert [(kind, state_) for kind, state_, _ in found] == [("user", "success")], (found, (tmp_path / "run_worker.log").read_text()[-3000:])
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
            proc.wait(timeout=10)
