"""The report that readies a wide fan-out, in one process: a root's success report in a run of a
root and `--tasks` tasks downstream of it, timed to its commit (when its first chunk's jobs are on
Redis and a worker can take one) and to the end of its last chunk, without workers around it.

    .venv/bin/python -m bench.fan_report [--tasks 10000] [--repeats 3]

In the whole stack (`python -m bench --only fanout,wide`) this report is the wide run's start:
every task downstream of the root waits for its commit. Uses a throwaway PostgreSQL database and
Redis database (the jobs go to Redis, emptied between repeats). Prints each repeat and the
median, beside the floor of the same run: the median round trip of `SELECT 1`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from bench import floors
from bench.stack import handle_stop_signals
from bench.throwaway import migrated_django


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fan_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks downstream of the root (default 10000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs, each with its own report (default 3)")
    args = parser.parse_args(argv)
    if min(args.tasks, args.repeats) < 1:
        parser.error("the sizes must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    load_before = os.getloadavg()
    with migrated_django("fan_report_bench"):
        dag = _fan_out_dag(args.tasks)
        timings = [time_report(dag) for _ in range(args.repeats)]
        floor = floors.select_one()
    print(f"load average before {[round(x, 2) for x in load_before]}, after {[round(x, 2) for x in os.getloadavg()]}")
    print(f"a root and {args.tasks} tasks downstream of it; {args.repeats} reports")
    for name in ("to its commit", "to its last chunk"):
        values = [one[name] for one in timings]
        print(f"  {name:<20} median {statistics.median(values) * 1000:8.1f} ms  ({', '.join(f'{v * 1000:.1f}' for v in values)})")
    print(f"  floor: SELECT 1 round trip {floor * 1000:.3f} ms median")
    return 0


def _fan_out_dag(tasks: int) -> Any:
    from orchestrator.models import Dag, Task

    dag = Dag.objects.create(dag_id="fan_report", max_active_runs=1000)
    middle = [Task(dag=dag, task_id=f"t{i:05d}", python_callable="bench.tasks.sleep", op_kwargs={"seconds": 0},
                   upstream=["root"], position=i + 1) for i in range(tasks)]
    root = Task(dag=dag, task_id="root", python_callable="bench.tasks.sleep", op_kwargs={"seconds": 0}, upstream=[], position=0)
    Task.objects.bulk_create([root, *middle], batch_size=2000)
    return dag


def time_report(dag: Any) -> dict[str, float]:
    """A new run; its root claimed and running; then its success report, timed."""
    from django.db import transaction
    from rq import Queue

    from orchestrator.engine import reporting, run_advance, run_creation
    from orchestrator.foundation.redis_conn import get_redis
    from orchestrator.models import TaskInstance

    run = run_creation.create_manual_run(dag)
    root = TaskInstance.objects.get(dag_run=run, task_id="root")
    worker = reporting.WorkerInfo(hostname="bench", worker_name="bench-fan-report", pid=os.getpid())
    assert reporting.claim(root.pk, root.attempt_token, worker)
    assert reporting.mark_running(root.pk, root.attempt_token, pid=os.getpid(), has_start_deadlines=False)
    queue = Queue("default", connection=get_redis())
    queue.empty()
    committed: list[float] = []
    real = run_advance.dispatch_later

    def timed(*args: Any, **kwargs: Any) -> int:
        committed.append(time.perf_counter())  # the first thing after the report's commit
        return real(*args, **kwargs)

    run_advance.dispatch_later = timed  # type: ignore[assignment]
    try:
        began = time.perf_counter()
        assert reporting.report_success(root.pk, root.attempt_token)
        ended = time.perf_counter()
    finally:
        run_advance.dispatch_later = real  # type: ignore[assignment]
    assert not transaction.get_connection().in_atomic_block
    jobs = queue.count
    expected = TaskInstance.objects.filter(dag_run=run).exclude(task_id="root").count()
    assert jobs == expected, f"{jobs} jobs on Redis for {expected} tasks"
    queue.empty()
    return {"to its commit": (committed[0] if committed else ended) - began, "to its last chunk": ended - began}


if __name__ == "__main__":
    sys.exit(main())
