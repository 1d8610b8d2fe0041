"""Benchmark: the engine end to end, one scheduler and N workers running no-op tasks.

    .venv/bin/python bench/engine_throughput.py --backend postgres
    .venv/bin/python bench/engine_throughput.py --backend sqlite

`--backend postgres` creates a throwaway database on the PostgreSQL server named by
DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres) and claims an empty Redis
database (1-15) on REDIS_URL's server (default redis://127.0.0.1:6379); both are dropped or
flushed at the end. `--backend sqlite` uses a temporary SQLite file with the project's default
settings (WAL, IMMEDIATE transactions, busy timeout) and the embedded redis-server; both are
removed at the end. It checks that one scheduler and N workers share the file without
"database is locked" errors.

The script migrates, creates the DAGs with the ORM, starts `manage.py run_scheduler` and
`--workers` `manage.py run_worker` processes, and runs these phases:

  * warm-up: one diamond run, not measured;
  * unloaded: `--latency-runs` diamond runs one after the other (per-task overhead without a backlog);
  * diamond: `--runs` runs of a 4-task diamond of `bash_command: "true"` triggered at once;
  * fan-out: `--fanout-runs` runs of `--fanout` independent python no-op tasks triggered at once;
  * idle pass: with the processes stopped, `schedule_once()` over `--idle-runs` running runs
    that have nothing to do (the scheduler's cost per pass).

Each phase prints its wall time, tasks/s and median/p95/max of: dispatch latency (attempt
queued_at -> start_date, split at the moment RQ handed the job to a worker), run time of the
no-op (start_date -> end_date), the worker's busy time per job, and for the diamond the
upstream-end -> downstream-queued/start latency. At the end: failed tasks, "database is
locked" / OperationalError lines in the processes' logs, and each process's peak RSS (VmHWM)
and CPU time (a worker's includes the task processes it started).
The exit status is 1 if a run did not succeed or a log shows a database error.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scheduler_pass import RUNNING, WAITING, populate, print_passes, time_passes
from bench.stack import (
    PhaseResult,
    Processes,
    child_env,
    embedded_redis,
    handle_stop_signals,
    make_dag,
    measure,
    print_phase,
    setup_django,
    trigger,
    wait_for_runs,
)
from bench.throwaway import claimed_redis, throwaway_postgres

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), required=True)
    parser.add_argument("--workers", type=int, default=2, help="run_worker processes (default 2)")
    parser.add_argument("--runs", type=int, default=40, help="diamond runs triggered at once (default 40)")
    parser.add_argument("--fanout-runs", type=int, default=4, help="fan-out runs triggered at once (default 4)")
    parser.add_argument("--fanout", type=int, default=10, help="independent python no-op tasks per fan-out run (default 10)")
    parser.add_argument("--latency-runs", type=int, default=3, help="diamond runs one after the other (default 3)")
    parser.add_argument("--idle-runs", type=int, default=1000, help="unfinished runs for the idle pass (default 1000)")
    parser.add_argument("--interval", type=float, default=0.2, help="ORCHESTRATOR_SCHEDULER_INTERVAL (default 0.2)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for one phase (default 600)")
    parser.add_argument("--keep-logs", action="store_true", help="copy the processes' logs to ./bench-logs-<backend>")
    args = parser.parse_args()
    if args.workers < 1 or args.runs < 0 or args.fanout_runs < 0 or args.fanout < 1 or args.idle_runs < 0:
        parser.error("--workers and --fanout must be at least 1; the run counts must not be negative")
    return args


# --- phases ---------------------------------------------------------------------------------------------


def run_phase(name: str, dag, count: int, processes: Processes, timeout: float) -> PhaseResult:
    run_ids, started = trigger(dag, count)
    wait_for_runs(run_ids, processes, timeout)
    result = measure(name, dict.fromkeys(run_ids, started))
    print_phase(result)
    return result


def run_sequentially(name: str, dag, count: int, processes: Processes, timeout: float) -> PhaseResult:
    """One run at a time: the per-task overhead with no backlog in front of the workers."""
    triggered: dict[int, datetime] = {}
    for _ in range(count):
        run_ids, started = trigger(dag, 1)
        wait_for_runs(run_ids, processes, timeout)
        triggered.update(dict.fromkeys(run_ids, started))
    result = measure(name, triggered)
    print_phase(result)
    return result


# --- the scheduler's idle pass -------------------------------------------------------------------------


def idle_pass(count: int, repeats: int = 3) -> dict[str, Any]:
    """Time schedule_once() over `count` running diamond runs whose root task is running (fresh
    heartbeat) and whose other tasks wait: every pass reads them all and changes nothing."""
    dag = populate("bench_idle", DIAMOND, {"a": RUNNING, "b": WAITING, "c": WAITING, "d": WAITING}, count)
    figures = time_passes(dag, repeats)
    print_passes(f"idle scheduler pass over {count} running runs with nothing to do", figures, count)
    return figures


# --- main ----------------------------------------------------------------------------------------------


def main() -> int:
    args = parse_args()
    handle_stop_signals()
    machine = f"{os.cpu_count()} CPUs"
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"engine-bench-{args.backend}-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        log_dir = workdir / "logs"
        log_dir.mkdir()
        if args.backend == "postgres":
            server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
            database_url = stack.enter_context(throwaway_postgres(server_url, "engine_bench"))
            redis_url = stack.enter_context(claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"))
        else:
            database_url = f"sqlite:///{workdir / 'bench.sqlite3'}"
            redis_url = stack.enter_context(embedded_redis(workdir / "redis"))
        env = child_env(database_url, redis_url, args.interval, ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"))
        setup_django(env)
        from django.core.management import call_command
        from django.db import connection, connections

        call_command("migrate", verbosity=0)
        vendor = f"PostgreSQL {connection.pg_version}" if connection.vendor == "postgresql" else f"SQLite {connection.Database.sqlite_version}"
        print(f"{vendor}, Redis at {redis_url}; {machine}; {args.workers} workers, scheduler interval {args.interval}s")

        warmup_dag = make_dag("bench_warmup", DIAMOND, bash="true", max_active_runs=1)
        latency_dag = make_dag("bench_latency", DIAMOND, bash="true", max_active_runs=1)
        diamond_dag = make_dag("bench_diamond", DIAMOND, bash="true", max_active_runs=args.runs)
        fanout_dag = make_dag(
            "bench_fanout", {f"noop_{i}": [] for i in range(args.fanout)}, max_active_runs=args.fanout_runs
        )
        connections.close_all()  # SQLite: hold no lock or snapshot while the children start

        processes = Processes(env, log_dir)
        if args.keep_logs:  # runs after the processes stopped (callbacks run last-in, first-out)
            stack.callback(shutil.copytree, log_dir, ROOT / f"bench-logs-{args.backend}", dirs_exist_ok=True)
        stack.callback(processes.stop)
        processes.start("scheduler", "run_scheduler")
        for n in range(1, args.workers + 1):
            processes.start(f"worker-{n}", "run_worker", "--name", f"bench-worker-{n}-{os.getpid()}")

        results: list[PhaseResult] = []
        began = time.monotonic()
        run_phase("warm-up (not counted)", warmup_dag, 1, processes, args.timeout)
        if args.latency_runs:
            results.append(run_sequentially(f"unloaded: {args.latency_runs} diamond runs one at a time", latency_dag,
                                            args.latency_runs, processes, args.timeout))
        if args.runs:
            results.append(run_phase(f"diamond: {args.runs} runs x 4 bash tasks at once", diamond_dag, args.runs, processes,
                                     args.timeout))
        if args.fanout_runs:
            results.append(run_phase(f"fan-out: {args.fanout_runs} runs x {args.fanout} python no-op tasks at once",
                                     fanout_dag, args.fanout_runs, processes, args.timeout))
        engine_seconds = time.monotonic() - began
        usage = processes.usage()
        processes.stop()
        alarms, notable = processes.scan_logs()
        connections.close_all()

        idle = idle_pass(args.idle_runs) if args.idle_runs else None

        failed_tasks = sum(r.failed_tasks for r in results)
        failed_runs = sum(r.failed_runs for r in results)
        locked = len(alarms["database is locked"])
        operational = len(alarms["OperationalError"])
        print("\n== processes")
        for name, (kib, own_cpu, children_cpu) in usage.items():
            print(f"  {name:<12} peak RSS (VmHWM) {kib / 1024:6.1f} MiB, CPU {own_cpu:6.1f} s own + {children_cpu:6.1f} s children")
        print(f"  log lines with 'database is locked': {locked}, with 'OperationalError': {operational}")
        for line in (alarms["database is locked"] + alarms["OperationalError"])[:10]:
            print(f"    {line}")
        if notable:
            print(f"  other error lines in the logs: {len(notable)}")
            for line in notable[:10]:
                print(f"    {line}")
        print(f"\nengine phases took {engine_seconds:.1f} s")
        summary = [f"backend={args.backend}", f"workers={args.workers}"]
        for result in results:
            key = result.name.split(":")[0]
            summary += [
                f"{key}_tasks_per_s={result.tasks_per_second:.2f}",
                f"{key}_dispatch_p50_ms={result.series['dispatch'].median_ms():.0f}",
                f"{key}_startup_p50_ms={result.series['startup'].median_ms():.0f}",
                f"{key}_run_p50_ms={result.series['run'].median_ms():.0f}",
            ]
        if idle:
            summary.append(f"idle_pass_ms={idle['pass_ms']:.1f}")
        worker_rss = [kib for name, (kib, _, _) in usage.items() if name.startswith("worker")]
        if worker_rss:
            summary.append(f"worker_peak_rss_mib={max(worker_rss) / 1024:.1f}")
        summary += [f"failed_tasks={failed_tasks}", f"locked_lines={locked}", f"operational_error_lines={operational}"]
        print("summary: " + " ".join(summary))
        if failed_tasks or failed_runs or locked or operational:
            print("FAILED: every run should succeed and no process should log a database error")
            return 1
        return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("interrupted: processes stopped, database and Redis cleaned up")
