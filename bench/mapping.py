"""Benchmark: a 1,000-instance mapped task against a plain 1,000-task fan-out, in the same run.

    .venv/bin/python bench/mapping.py --backend postgres
    .venv/bin/python bench/mapping.py --backend sqlite
    .venv/bin/python bench/mapping.py --backend sqlite --width 10000 --repeats 3 --expansion-only

Databases and Redis as `bench/engine_throughput.py` makes them (a throwaway PostgreSQL database
or a temporary SQLite file; a claimed or embedded Redis), removed at the end. Two measurements:

  * expansion, in this process with no worker running: `advance_run()` of a fresh run whose one
    task is mapped over a `--width`-item list literal (expand: one fenced UPDATE of the
    placeholder and one INSERT of the other instances, then dispatch them all), against the same
    call for a run of a DAG with `--width` plain tasks (settle them, dispatch them all): median
    of `--repeats` runs each, RQ jobs included;
  * throughput, with one scheduler and `--workers` workers, after a warm-up run: a run of `root -> mapped(width)`
    (the root returns the list, `bench.tasks.items`) and a run of `root -> width plain tasks`,
    each python no-op (`bench.tasks.noop_item` / `bench.tasks.noop`), one after the other:
    tasks per second from the trigger to the run's end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.stack import Processes, child_env, embedded_redis, handle_stop_signals, make_dag, measure, print_phase, setup_django, trigger, wait_for_runs
from bench.throwaway import claimed_redis, throwaway_postgres


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), required=True)
    parser.add_argument("--width", type=int, default=1000, help="instances of the mapped task, tasks of the fan-out (default 1000)")
    parser.add_argument("--workers", type=int, default=2, help="run_worker processes (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="expansions timed (default 5)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for one run (default 900)")
    parser.add_argument("--expansion-only", action="store_true", help="measure the expansion only (no workers, no runs)")
    return parser.parse_args()


def mapped_dag(dag_id: str, width: int, *, literal: bool):
    """`root -> load` mapped over the root's list result, or (literal) `load` over a list literal."""
    from orchestrator.models import Dag, Task

    dag = Dag.objects.create(dag_id=dag_id, schedule=None, max_active_runs=50)
    if literal:
        Task.objects.create(dag=dag, task_id="load", python_callable="bench.tasks.noop_item", expand={"item": list(range(width))})
        return dag
    Task.objects.create(dag=dag, task_id="root", python_callable="bench.tasks.items", op_kwargs={"count": width}, position=0)
    Task.objects.create(dag=dag, task_id="load", python_callable="bench.tasks.noop_item", upstream=["root"],
                        expand={"item": "results.root"}, position=1)
    return dag


def time_advance(dag, repeats: int, expansions: list[float] | None = None) -> float:
    """Median seconds of advance_run() over a fresh run of `dag` (its jobs enqueued on commit).
    `expansions`: gets the seconds each expansion itself took (creating the instances), of them."""
    from django.db import transaction
    from django.utils import timezone

    from orchestrator.engine import run_settling
    from orchestrator.engine.run_advance import advance_run
    from orchestrator.engine.run_creation import create_run
    from orchestrator.models import DagRun

    real_expand = run_settling.expand_ready

    def timed_expand(*args, **kwargs):
        began = time.perf_counter()
        try:
            return real_expand(*args, **kwargs)
        finally:
            if expansions is not None:
                expansions.append(time.perf_counter() - began)

    run_settling.expand_ready = timed_expand
    times = []
    for _ in range(repeats):
        now = timezone.now()
        run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now, now=now, triggered_by="bench")
        began = time.perf_counter()
        with transaction.atomic():
            advance_run(run.pk, now)
        times.append(time.perf_counter() - began)  # with the chunks dispatched after the commit
        # (The count advance_run returns inside a caller's transaction is its first chunk's.)
        queued = run.task_instances.filter(state="queued").count()
        assert queued == run.task_instances.count(), (queued, run.task_instances.count())
    run_settling.expand_ready = real_expand
    return statistics.median(times)


def insert_floor() -> float:
    """Seconds for the database to write a mapped task's instances with no Python in between: the
    last expanded run's instances 1..n copied by one INSERT ... SELECT (same columns, same
    indexes), rolled back. The least an expansion of that width can cost on this server now."""
    from django.db import connection, transaction

    from orchestrator.data import sql
    from orchestrator.models import TaskInstance

    fields = [field.column for field in sql.concrete_fields(TaskInstance) if not field.primary_key]
    columns = ", ".join(connection.ops.quote_name(column) for column in fields)
    copied = ", ".join("map_index + 1000000" if column == "map_index" else connection.ops.quote_name(column) for column in fields)
    run_pk = TaskInstance.objects.filter(task_id="load").order_by("-dag_run_id").values_list("dag_run_id", flat=True).first()
    began = time.perf_counter()
    with transaction.atomic():
        sql.execute(f"INSERT INTO orchestrator_taskinstance ({columns}) SELECT {copied} FROM orchestrator_taskinstance"
                    " WHERE dag_run_id = %s AND task_id = 'load' AND map_index >= 1", [run_pk])
        seconds = time.perf_counter() - began
        transaction.set_rollback(True)
    return seconds


def main() -> int:
    args = parse_args()
    handle_stop_signals()
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"mapping-bench-{args.backend}-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        (workdir / "logs").mkdir()
        if args.backend == "postgres":
            server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
            database_url = stack.enter_context(throwaway_postgres(server_url, "mapping_bench"))
            redis_url = stack.enter_context(claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"))
        else:
            database_url = f"sqlite:///{workdir / 'bench.sqlite3'}"
            redis_url = stack.enter_context(embedded_redis(workdir / "redis"))
        env = child_env(database_url, redis_url, 0.2, ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"),
                        ORCHESTRATOR_MAX_MAP_LENGTH=str(max(1024, args.width)))  # the default allows 1,024 items
        os.environ["ORCHESTRATOR_MAX_MAP_LENGTH"] = env["ORCHESTRATOR_MAX_MAP_LENGTH"]  # this process expands too
        setup_django(env)
        from django.core.management import call_command
        from django.db import connection, connections

        call_command("migrate", verbosity=0)
        vendor = f"PostgreSQL {connection.pg_version}" if connection.vendor == "postgresql" else f"SQLite {connection.Database.sqlite_version}"
        print(f"{vendor}; {os.cpu_count()} CPUs; width {args.width}; {args.workers} workers")

        # Expansion, no worker running: the jobs wait in Redis and are flushed with it.
        expansions: list[float] = []
        mapped_seconds = time_advance(mapped_dag("bench_expand", args.width, literal=True), args.repeats, expansions)
        expand_seconds = statistics.median(expansions)
        plain_seconds = time_advance(make_dag("bench_settle", {f"t{i}": [] for i in range(args.width)}, max_active_runs=50), args.repeats)
        print(f"\n== advance_run of a fresh run, median of {args.repeats}")
        print(f"  mapped task of {args.width} (expand + dispatch): {mapped_seconds * 1000:8.1f} ms")
        print(f"    of which the expansion (the instances created): {expand_seconds * 1000:8.1f} ms")
        print(f"  {args.width} plain tasks (settle + dispatch):   {plain_seconds * 1000:8.1f} ms")
        from rq import Queue

        from orchestrator.foundation.redis_conn import get_redis

        # The expansions' jobs go, not the database: its claim (`claimed_redis`) must stay for
        # the database to be flushed at the end.
        Queue("default", connection=get_redis()).empty()
        floor_seconds = insert_floor()
        print(f"  floor: the database copying {args.width - 1} of those instances itself (INSERT ... SELECT): {floor_seconds * 1000:8.1f} ms")
        if args.expansion_only:
            print(f"summary: backend={args.backend} width={args.width} advance_ms={mapped_seconds * 1000:.1f} expansion_ms={expand_seconds * 1000:.1f}"
                  f" plain_settle_ms={plain_seconds * 1000:.1f} insert_floor_ms={floor_seconds * 1000:.1f}")
            return 0

        mapped = mapped_dag("bench_mapped", args.width, literal=False)
        plain = make_dag("bench_plain", {"root": [], **{f"t{i}": ["root"] for i in range(args.width)}})
        make_dag("bench_warmup", {"a": [], "b": ["a"]})
        connections.close_all()
        processes = Processes(env, workdir / "logs")
        stack.callback(processes.stop)
        processes.start("scheduler", "run_scheduler")
        for n in range(1, args.workers + 1):
            processes.start(f"worker-{n}", "run_worker", "--name", f"mapping-bench-{n}-{os.getpid()}")

        # Warm-up (not counted): the scheduler's first passes and the workers' fork servers.
        from orchestrator.models import Dag

        run_ids, _ = trigger(Dag.objects.get(dag_id="bench_warmup"), 1)
        wait_for_runs(run_ids, processes, args.timeout)

        results = []
        for name, dag in ((f"mapped: root -> {args.width} instances", mapped), (f"plain: root -> {args.width} tasks", plain)):
            run_ids, started = trigger(dag, 1)
            wait_for_runs(run_ids, processes, args.timeout)
            result = measure(name, dict.fromkeys(run_ids, started))
            print_phase(result)
            results.append(result)
        processes.stop()
        failed = sum(r.failed_tasks + r.failed_runs for r in results)
        print("summary: " + " ".join([
            f"backend={args.backend}", f"width={args.width}",
            f"advance_ms={mapped_seconds * 1000:.1f}", f"expansion_ms={expand_seconds * 1000:.1f}", f"plain_settle_ms={plain_seconds * 1000:.1f}",
            *(f"{r.name.split(':')[0]}_tasks_per_s={r.tasks_per_second:.2f}" for r in results),
            f"failed={failed}",
        ]))
        return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("interrupted: processes stopped, database and Redis cleaned up")
