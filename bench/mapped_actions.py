"""Benchmark: an operator's action on every instance of a mapped task (clear, mark success, mark failed).

    .venv/bin/python bench/mapped_actions.py --backend postgres
    .venv/bin/python bench/mapped_actions.py --backend sqlite --widths 1000

Databases and Redis as `bench/mapping.py` makes them (a throwaway PostgreSQL database or a
temporary SQLite file; a claimed or embedded Redis), removed at the end; no worker runs. For each
width: a run of `each` mapped over a list literal of that many items, then `report`, with every
instance failed (written directly) and `report` upstream_failed; then, timed, `act_on_task` as
the API calls it for the task without a map_index: clear (every instance back to none, the
report reset, the run reopened, then dispatched again by the action's own `advance_run`),
mark_failed of the queued instances, and mark_success. Wall seconds, and the database's share:
the seconds spent in statements (each from send to result, measured around the cursor).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.stack import child_env, embedded_redis, handle_stop_signals, setup_django
from bench.throwaway import claimed_redis, throwaway_postgres


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), required=True)
    parser.add_argument("--widths", default="128,256,512,1000", help="instances of the mapped task, comma-separated")
    parser.add_argument("--actions", default="clear,mark_failed,mark_success", help="actions timed, in this order")
    return parser.parse_args()


class DatabaseTime:
    """Seconds spent in statements and their count, summed around the connection's cursor."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.statements = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - began
            self.statements += 1


@contextmanager
def timed(label: str, width: int):
    from django.db import connection

    spent = DatabaseTime()
    began = time.perf_counter()
    with connection.execute_wrapper(spent):
        yield
    wall = time.perf_counter() - began
    print(f"  {label:<13} {width:>5} instances: {wall * 1000:9.1f} ms wall, {spent.seconds * 1000:9.1f} ms in {spent.statements} statements")


def failed_run(width: int):
    """A run of `each` over `width` items then `report`: every instance failed, report upstream_failed."""
    from django.utils import timezone

    from orchestrator.engine.run_advance import advance_run
    from orchestrator.engine.run_creation import create_run
    from orchestrator.models import Dag, DagRun, Task, TaskInstance

    dag = Dag.objects.create(dag_id=f"bench_actions_{width}", schedule=None, default_args={"retries": 1}, max_active_runs=50)
    Task.objects.create(dag=dag, task_id="each", python_callable="bench.tasks.noop_item", expand={"item": list(range(width))}, position=0)
    Task.objects.create(dag=dag, task_id="report", python_callable="bench.tasks.noop", upstream=["each"], position=1)
    now = timezone.now()
    run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now, now=now, triggered_by="bench")
    advance_run(run.pk, now)
    TaskInstance.objects.filter(dag_run=run, task_id="each").update(state="failed", end_date=now)
    TaskInstance.objects.filter(dag_run=run, task_id="report").update(state="upstream_failed", end_date=now)
    DagRun.objects.filter(pk=run.pk).update(state="failed", end_date=now)
    return run


def main() -> int:
    args = parse_args()
    handle_stop_signals()
    widths = [int(w) for w in args.widths.split(",")]
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"mapped-actions-bench-{args.backend}-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        if args.backend == "postgres":
            server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
            database_url = stack.enter_context(throwaway_postgres(server_url, "mapped_actions_bench"))
            redis_url = stack.enter_context(claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"))
        else:
            database_url = f"sqlite:///{workdir / 'bench.sqlite3'}"
            redis_url = stack.enter_context(embedded_redis(workdir / "redis"))
        env = child_env(database_url, redis_url, 0.2, ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"))
        setup_django(env)
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connection
        from rq import Queue

        from orchestrator.foundation.redis_conn import get_redis
        from orchestrator.operations import actions

        call_command("migrate", verbosity=0)
        vendor = f"PostgreSQL {connection.pg_version}" if connection.vendor == "postgresql" else f"SQLite {connection.Database.sqlite_version}"
        print(f"{vendor}; {os.cpu_count()} CPUs; widths {widths}")
        user = User.objects.create_superuser("bench", "bench@example.com", "bench")
        for width in widths:
            run = failed_run(width)
            for action in args.actions.split(","):
                instances = actions.find_task_instances(run.dag.dag_id, run.run_id, "each")
                with timed(action, width):
                    done = actions.act_on_task(action, instances, user, note="bench")
                assert len(done) == width, (action, len(done))
            Queue("default", connection=get_redis()).empty()  # the jobs the clear dispatched
    return 0


if __name__ == "__main__":
    sys.exit(main())
