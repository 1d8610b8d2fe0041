"""Benchmark: the engine and the console over a year of history.

    .venv/bin/python -m bench.history                      # 1,000,000 finished task instances, everything
    .venv/bin/python -m bench.history --only scheduler,failures
    .venv/bin/python -m bench.history --finished 100000 --only clean   # a quick look

It creates a throwaway PostgreSQL database on DATABASE_URL's server (default
postgres://postgres@127.0.0.1:5432/postgres) and claims an empty Redis database 1-15 on
REDIS_URL's server, migrates, and loads with COPY a year of finished history: `--finished` task
instances of `--dags` DAGs of `--tasks` independent tasks (one run per `--tasks` of them, spread
evenly over `--days` days), each with its attempts. Most succeed at once; some fail and succeed
on a retry, a few fail for good (their run fails), with the failure categories and reasons of
the contract in realistic shares, fingerprints for the application failures, and the hourly
failure counts filled from the attempts (as migration 0003 fills them), so they agree. Then
`--active-runs` running runs of `--active-tasks` task instances each (60 % running with a fresh
heartbeat, 20 % claimed, 20 % waiting in Redis) as the scheduler benchmark makes them, and
VACUUM ANALYZE (a history table in steady state has been vacuumed), and the floors that need
no worker (`python -c pass`, a warm fork). Then, in this order:

  scheduler  schedule_once() in this process, median of --repeat passes (no scheduler or worker
             running): the pass over the active task instances with the history in the tables
  failures   the failures page through Django's test client (server time), windows 24h, 7d, 30d,
             and 30d with reason=task_exception (the filter that reads attempts)
  clean      `manage.py db_clean --older-than --clean-days [--max-duty --clean-duty]` in a child process: its longest
             transaction by its own report, how long each of its transactions stays open
             (pg_stat_activity, sampled every 50 ms), and meanwhile schedule_once() in this
             process every --clean-pass-every seconds: the pass's time while the clean deletes

The database is dropped and the Redis database flushed at the end, also after an error or Ctrl-C.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.stack import MANAGE, ROOT, child_env, handle_stop_signals, setup_django
from bench.throwaway import claimed_redis, throwaway_postgres

PHASES = ("scheduler", "failures", "clean")
CHUNK_RUNS = 2000  # runs written per round of COPY: bounds the rows held in memory
TARGETS = {"scheduler": 50.0, "failures": 300.0, "clean_lock_s": 1.0}

# (category, reason, kind, share of failed attempts): the shares are made up, the names are the
# contract's. A platform failure (infrastructure) is retried on the platform's budget.
FAILURES = (
    ("application", "task_exception", "user", 0.52),
    ("application", "nonzero_exit", "user", 0.10),
    ("timeout", "execution_timeout", "user", 0.10),
    ("infrastructure", "worker_lost", "platform", 0.08),
    ("infrastructure", "db_connection_error", "platform", 0.06),
    ("infrastructure", "resource_exhaustion", "platform", 0.05),
    ("infrastructure", "worker_termination", "platform", 0.04),
    ("infrastructure", "queue_lost", "platform", 0.02),
    ("infrastructure", "pre_execution_failure", "platform", 0.01),
    ("application", "non_retryable", "user", 0.02),
)
# (failed attempts before the last one, the last one's outcome, share): a task instance's history.
OUTCOMES = ((0, "success", 0.935), (1, "success", 0.050), (2, "success", 0.013), (3, "failed", 0.002))
HOSTS = [f"worker-{n:02d}.example.internal" for n in range(12)]
TRACEBACK = ('Traceback (most recent call last):\n  File "/srv/etl/tasks.py", line 88, in run\n'
             '    rows = fetch(batch)\n  File "/srv/etl/source.py", line 41, in fetch\n    raise {exc}({msg!r})\n{exc}: {msg}\n')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--only", default=",".join(PHASES), help=f"comma-separated phases (default all: {','.join(PHASES)})")
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished task instances (default 1000000)")
    parser.add_argument("--dags", type=int, default=20, help="DAGs of the history (default 20)")
    parser.add_argument("--tasks", type=int, default=50, help="tasks per DAG, task instances per run (default 50)")
    parser.add_argument("--days", type=float, default=365.0, help="how far back the history goes (default 365)")
    parser.add_argument("--active-runs", type=int, default=200, help="running runs (default 200)")
    parser.add_argument("--active-tasks", type=int, default=50, help="active task instances per running run (default 50)")
    parser.add_argument("--repeat", type=int, default=7, help="timed scheduler passes and page loads; the median counts (default 7)")
    parser.add_argument("--clean-days", type=float, default=30.0, help="db_clean --older-than (default 30)")
    parser.add_argument("--clean-pass-every", type=float, default=2.0, help="seconds between scheduler passes during the clean (default 2)")
    parser.add_argument("--clean-duty", default=None, help="db_clean --max-duty (default: db_clean's own, ORCHESTRATOR_RETENTION_DUTY)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one scheduler pass and one failures page load")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the database (prints its URL) instead of dropping it")
    args = parser.parse_args(argv)
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.only) - set(PHASES))
    if unknown:
        parser.error(f"unknown phases {', '.join(unknown)}: choose among {', '.join(PHASES)}")
    if min(args.finished, args.dags, args.tasks, args.active_runs, args.active_tasks, args.repeat) < 1:
        parser.error("the sizes must be at least 1")
    return args


# --- the history -----------------------------------------------------------------------------------


def _copy(table: str, columns: list[str], rows: Iterator[tuple]) -> int:
    """COPY rows into `table`; returns how many."""
    from django.db import connection

    n = 0
    with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
            n += 1
    return n


def _defaults(model, given: set[str]) -> dict[str, Any]:
    """Every column of `model` not in `given`, with its field's default (COPY bypasses Django's
    defaults, and most columns have none in the database)."""
    from django.db.models import NOT_PROVIDED

    out = {}
    for field in model._meta.concrete_fields:
        if field.primary_key or field.column in given:
            continue
        value = field.get_default() if field.has_default() or field.default is not NOT_PROVIDED else None
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            value = datetime.now(UTC)
        out[field.column] = json.dumps(value) if field.get_internal_type() == "JSONField" and value is not None else value
    return out


def _pick(rng: random.Random, table: tuple) -> tuple:
    x, acc = rng.random(), 0.0
    for row in table:
        acc += row[-1]
        if x < acc:
            return row
    return table[-1]


def load_history(args: argparse.Namespace, now: datetime) -> dict[str, int]:
    """COPY the finished history (see the module), a chunk of runs at a time; returns the row counts."""
    from django.db import connection

    from orchestrator.models import Dag, DagRun, Task, TaskAttempt, TaskInstance

    rng = random.Random(2024)
    dags = [Dag.objects.create(dag_id=f"history_{d:02d}", schedule=None, max_active_runs=16) for d in range(args.dags)]
    Task.objects.bulk_create(
        Task(dag=dag, task_id=f"t{k:03d}", python_callable="bench.tasks.noop", position=k) for dag in dags for k in range(args.tasks)
    )
    task_pk = {(t.dag_id, t.task_id): t.pk for t in Task.objects.filter(dag__in=dags)}
    runs = -(-args.finished // args.tasks)
    span = timedelta(days=args.days).total_seconds()
    run_cols = ["id", "dag_id", "run_id", "run_type", "state", "logical_date", "queued_at", "start_date", "end_date"]
    ti_cols = ["id", "dag_run_id", "definition_id", "task_id", "state", "try_number", "max_tries", "infrastructure_try_number",
               "attempt_token", "queued_at", "start_date", "end_date", "last_failure_context", "failure_fingerprint", "hostname",
               "worker_name", "updated_at"]
    attempt_cols = ["id", "task_instance_id", "attempt_token", "try_number", "infrastructure_try_number", "kind", "state", "queued_at",
                    "start_date", "end_date", "context", "fingerprint", "result", "stdout", "stderr", "hostname", "worker_name", "pid"]
    tables = [(DagRun, run_cols), (TaskInstance, ti_cols), (TaskAttempt, attempt_cols)]
    extras = [_defaults(model, set(cols)) for model, cols in tables]
    counts = {"runs": 0, "failed_runs": 0, "task_instances": 0, "attempts": 0, "failed_attempts": 0}

    # Every run, task instance and attempt gets its id here (the tables are empty), so that a
    # chunk's rows are written without reading anything back; the sequences move past them last.
    ti_id = attempt_id = 0
    for first in range(0, runs, CHUNK_RUNS):
        run_rows: list[tuple] = []
        ti_rows: list[tuple] = []
        attempt_rows: list[tuple] = []
        for r in range(first, min(runs, first + CHUNK_RUNS)):
            dag = dags[r % len(dags)]
            started = now - timedelta(seconds=span * (1 - r / runs)) - timedelta(hours=1)
            end, run_state = started, "success"
            for k in range(min(args.tasks, args.finished - ti_id)):
                ti_id += 1
                task_id = f"t{k:03d}"
                fails, final, _ = _pick(rng, OUTCOMES)
                at = started + timedelta(seconds=rng.uniform(0, 600))
                try_number = infra = 0
                last_context, last_fp, host = None, None, HOSTS[0]
                for n in range(fails + 1):
                    attempt_id += 1
                    host = rng.choice(HOSTS)
                    begun = at + timedelta(milliseconds=rng.uniform(20, 400))
                    ended = begun + timedelta(seconds=rng.uniform(0.5, 90))
                    failed = n < fails or final == "failed"
                    context = fp = None
                    stderr, kind = "", "user"
                    if failed:
                        category, reason, kind, _ = _pick(rng, FAILURES)
                        exc, msg = (("ValueError", f"bad row {rng.randrange(40)}") if category == "application"
                                    else ("TimeoutError", "execution timeout") if category == "timeout" else ("", ""))
                        if category == "application":
                            fp = hashlib.blake2b(f"{dag.dag_id} {task_id} {msg}".encode(), digest_size=6).hexdigest()
                        context = {"category": category, "reason": reason,
                                   "source": "scheduler" if category == "infrastructure" else "worker",
                                   "metadata": {"exception_type": exc, "message": msg} if exc else {}}
                        stderr = TRACEBACK.format(exc=exc, msg=msg) if exc else ""
                        last_context, last_fp = context, fp
                        counts["failed_attempts"] += 1
                    if kind == "user":
                        try_number += 1
                    else:
                        infra += 1
                    attempt_rows.append((attempt_id, ti_id, n + 1, max(try_number, 1), infra, kind, "failed" if failed else "success",
                                         at, begun, ended, json.dumps(context) if context else None, fp,
                                         None if failed else json.dumps({"rows": rng.randrange(10_000)}), "", stderr, host,
                                         f"{host}:bench", rng.randrange(2, 65_000)))
                    at = ended + timedelta(seconds=30)
                ended_at = at - timedelta(seconds=30)
                end = max(end, ended_at)
                run_state = "failed" if final == "failed" else run_state
                ti_rows.append((ti_id, r + 1, task_pk[(dag.pk, task_id)], task_id, final, max(try_number, 1), 3, infra, fails + 1,
                                started, started + timedelta(milliseconds=100), ended_at,
                                json.dumps(last_context) if last_context else None, last_fp, host, f"{host}:bench", ended_at))
            counts["failed_runs"] += run_state == "failed"
            run_rows.append((r + 1, dag.pk, f"manual__{r:07d}", "manual", run_state, started, started, started, end))
        for (model, cols), extra, rows in zip(tables, extras, (run_rows, ti_rows, attempt_rows), strict=True):
            n = _copy(model._meta.db_table, cols + list(extra), ((*row, *extra.values()) for row in rows))
            counts[{DagRun: "runs", TaskInstance: "task_instances", TaskAttempt: "attempts"}[model]] += n
        print(f"  {counts['task_instances']:,} task instances, {counts['attempts']:,} attempts", flush=True)
    with connection.cursor() as cursor:
        for model, _ in tables:
            table = model._meta.db_table
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
    return counts


def load_active(args: argparse.Namespace):
    """The running runs the scheduler's pass works over (bench.scheduler_pass.populate)."""
    from bench.scheduler_pass import CLAIMED, QUEUED, RUNNING, populate

    kinds = {}
    for i in range(args.active_tasks):
        kinds[f"t{i:03d}"] = RUNNING if i < args.active_tasks * 0.6 else CLAIMED if i < args.active_tasks * 0.8 else QUEUED
    return populate("bench_active", {task_id: [] for task_id in kinds}, kinds, args.active_runs)


def vacuum_analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


# --- the phases ------------------------------------------------------------------------------------


def explain(statements: list[str]) -> None:
    """EXPLAIN ANALYZE of each read-only statement (in a transaction rolled back)."""
    from django.db import connection, transaction

    for statement in statements:
        if not statement.lstrip().upper().startswith("SELECT") or "FOR UPDATE" in statement.upper():
            continue
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}")
            print("\n".join(row[0] for row in cursor.fetchall()))
            transaction.set_rollback(True)


def print_profile(function) -> None:
    """cProfile of one call: the 25 functions with the most cumulative time."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.runcall(function)
    pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(25)


def scheduler_phase(dag, args: argparse.Namespace) -> dict[str, Any]:
    from bench.scheduler_pass import print_passes, time_passes

    figures = time_passes(dag, repeats=args.repeat)
    print_passes(f"scheduler pass over {args.active_runs * args.active_tasks:,} active task instances with the history loaded",
                 figures, args.active_runs)
    for ms, statement in figures["statements"][:3]:
        print(f"    {ms:7.1f} ms  {statement[:200]}")
    if args.profile:
        explain([statement for _, statement in figures["statements"][:3]])
        from bench.scheduler_pass import refresh_heartbeats
        from orchestrator.engine import scheduler

        refresh_heartbeats(dag)
        print_profile(scheduler.schedule_once)
    figures["target_ms"] = TARGETS["scheduler"]
    figures["passed"] = figures["pass_ms"] <= TARGETS["scheduler"] and not figures["changed"]
    return figures


def failures_phase(args: argparse.Namespace) -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.ALLOWED_HOSTS = ["*"]
    client = Client()
    client.force_login(User.objects.create_user("bench-history"))
    out = {}
    print(f"\n== failures page (server time through the test client, median of {args.repeat} after one warm-up)")
    for window, extra in (("24h", ""), ("7d", ""), ("30d", ""), ("30d", "&reason=task_exception")):
        url = f"/failures/?window={window}{extra}"
        client.get(url)
        times = []
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as queries:
                began = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - began) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}")
        slowest = max(queries.captured_queries, key=lambda q: float(q["time"]))
        out[url] = {"median_ms": statistics.median(times), "max_ms": max(times), "queries": len(queries),
                    "slowest_query_ms": float(slowest["time"]) * 1000}
        print(f"  {url:<44} median {out[url]['median_ms']:7.1f} ms  worst {out[url]['max_ms']:7.1f} ms  "
              f"{len(queries)} queries (slowest {out[url]['slowest_query_ms']:.0f} ms)")
    if args.profile:
        print_profile(lambda: client.get("/failures/?window=30d"))
    worst = max(row["median_ms"] for row in out.values())
    return {"pages": out, "worst_median_ms": worst, "target_ms": TARGETS["failures"], "passed": worst <= TARGETS["failures"]}


CLEAN_APP = "bench-db-clean"  # the child's application_name (PGAPPNAME), to find its transactions
OWN_APP = "bench-history"  # this process's, to see what its statements wait for meanwhile


class TransactionWatch:
    """How long each transaction of the backends named CLEAN_APP stays open, sampled from
    pg_stat_activity every `every` seconds on a connection of its own (in a thread): the ones
    shorter than a sample may be missed, the long ones are not."""

    def __init__(self, db_url: str, every: float = 0.05) -> None:
        import threading

        self.db_url, self.every = db_url, every
        self.longest: dict[tuple[int, datetime], float] = {}
        self.own_waits: dict[str, int] = {}  # what this process's active statements wait on, per sample
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not self.stopping.is_set():
                rows = conn.execute("SELECT pid, xact_start, extract(epoch FROM clock_timestamp() - xact_start) FROM pg_stat_activity "
                                    "WHERE application_name = %s AND xact_start IS NOT NULL", [CLEAN_APP]).fetchall()
                for pid, started, age in rows:
                    self.longest[(pid, started)] = max(self.longest.get((pid, started), 0.0), float(age))
                for kind, event in conn.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity "
                                                "WHERE application_name = %s AND state = 'active' AND pid <> pg_backend_pid()", [OWN_APP]).fetchall():
                    key = f"{kind}:{event}" if kind else "not waiting (on CPU or queued for it)"
                    self.own_waits[key] = self.own_waits.get(key, 0) + 1
                time.sleep(self.every)

    def __enter__(self) -> TransactionWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()

    def summary(self) -> dict[str, Any]:
        ages = sorted(self.longest.values())
        return {"seen": len(ages), "over_0_5_s": sum(a > 0.5 for a in ages), "over_1_s": sum(a > 1.0 for a in ages),
                "longest_s": round(ages[-1], 2) if ages else None,
                "p95_s": round(ages[int(len(ages) * 0.95)], 3) if ages else None,
                "scheduler_statement_samples": dict(sorted(self.own_waits.items(), key=lambda kv: -kv[1]))}


def clean_phase(dag, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """db_clean in a child process; scheduler passes here meanwhile, and a watch on how long
    each of the clean's transactions stays open."""
    from django.utils import timezone

    from bench.scheduler_pass import time_passes
    from orchestrator.models import TaskAttempt

    cutoff = timezone.now() - timedelta(days=args.clean_days)
    older = TaskAttempt.objects.filter(task_instance__dag_run__end_date__lt=cutoff).count()
    print(f"\n== db_clean --older-than {args.clean_days:g}: {older:,} attempts of runs that ended before the cut-off")
    argv = [sys.executable, str(MANAGE), "db_clean", "--older-than", str(args.clean_days)]
    if args.clean_duty is not None:
        argv += ["--max-duty", str(args.clean_duty)]
    passes: list[dict[str, Any]] = []
    with TransactionWatch(env["DATABASE_URL"]) as watch:
        began = time.monotonic()
        child = subprocess.Popen(argv, env={**env, "PGAPPNAME": CLEAN_APP}, cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:
            while child.poll() is None:
                time.sleep(args.clean_pass_every)
                if child.poll() is None:
                    passes.append(time_passes(dag, repeats=1, steps=False))
            output = child.stdout.read() if child.stdout else ""
        finally:
            if child.poll() is None:
                child.terminate()
                child.wait()
        wall = time.monotonic() - began
    print("  " + "\n  ".join(output.strip().splitlines()[-3:]))
    if child.returncode:
        raise RuntimeError(f"db_clean exited {child.returncode}")
    done = next(line for line in output.splitlines() if line.startswith("done:"))
    longest = float(done.rsplit("longest ", 1)[1].split(" s")[0])
    transactions = int(done.split(" in ", 1)[1].split(" transactions")[0])
    left = TaskAttempt.objects.filter(task_instance__dag_run__end_date__lt=cutoff).count()
    pass_ms = [p["pass_ms"] for p in passes]
    figures = {
        "attempts_older": older, "attempts_left": left, "wall_s": round(wall, 1), "transactions": transactions,
        "longest_transaction_s": longest, "attempts_per_s": round(older / wall), "watched": watch.summary(),
        "passes_during": len(passes), "pass_median_ms": statistics.median(pass_ms) if passes else None,
        "pass_max_ms": max(pass_ms) if passes else None,
        "pass_sql_median_ms": statistics.median(p["sql_ms"] for p in passes) if passes else None,
    }
    print(f"  {older:,} attempts deleted in {wall:.1f} s ({figures['attempts_per_s']:,}/s), {transactions} transactions, "
          f"longest {longest:.2f} s; {left} older attempts left")
    w = figures["watched"]
    print(f"  transactions seen open (sampled every 50 ms): {w['seen']}, of them {w['over_0_5_s']} over 0.5 s and {w['over_1_s']} "
          f"over 1 s; p95 {w['p95_s']} s, longest {w['longest_s']} s")
    if passes:
        print(f"  {len(passes)} scheduler passes meanwhile: median {figures['pass_median_ms']:.1f} ms "
              f"({figures['pass_sql_median_ms']:.0f} ms of it in the database calls), worst {figures['pass_max_ms']:.1f} ms")
        by_statement: dict[str, list[float]] = {}
        for p in passes:
            for ms, statement in p["statements"]:
                by_statement.setdefault(re.sub(r"'[^']*'", "?", statement)[:150], []).append(ms)
        figures["pass_statements_ms"] = {k: round(statistics.median(v), 1) for k, v in
                                         sorted(by_statement.items(), key=lambda kv: -statistics.median(kv[1]))[:4]}
        for statement, ms in figures["pass_statements_ms"].items():
            print(f"    median {ms:7.1f} ms  {statement}")
        print(f"  the pass's statements, sampled every 50 ms: {w['scheduler_statement_samples']}")
    figures["passed"] = (longest <= TARGETS["clean_lock_s"] and left == 0 and bool(passes)
                         and figures["pass_median_ms"] <= TARGETS["scheduler"])
    return figures


def measure_floors(env: dict[str, str]) -> dict[str, Any]:
    """The floors of `python -m bench` that need no worker (bench/floors.py), and the load
    average, right before the phases: what this machine gave a process at the time."""
    from bench import floors

    out = {"python_c_pass": floors.python_startup(20, env), "warm_fork": floors.warm_fork(200, env),
           "load_average": [round(x, 2) for x in os.getloadavg()]}
    print(f"floors: python -c pass {out['python_c_pass']['mean_ms']:.1f} ms mean of 20; fork + _exit + waitpid of a warm Django "
          f"process {out['warm_fork']['mean_ms']:.2f} ms mean of 200; load average {out['load_average']}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    report: dict[str, Any] = {"command": "python -m bench.history " + " ".join(sys.argv[1:] if argv is None else argv),
                              "load_before": [round(x, 2) for x in os.getloadavg()]}
    server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    with throwaway_postgres(server_url, "history_bench", keep=args.keep) as db_url, \
            claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379") as redis_url:
        env = child_env(db_url, redis_url, LOG_LEVEL="WARNING")
        os.environ["PGAPPNAME"] = OWN_APP  # libpq's default application_name, for TransactionWatch
        setup_django(env)
        from django.core.management import call_command
        from django.utils import timezone

        from orchestrator.engine import failure_counts

        call_command("migrate", verbosity=0)
        began = time.monotonic()
        counts = load_history(args, timezone.now())
        failure_counts.backfill()
        copied = time.monotonic() - began
        dag = load_active(args)
        vacuum_analyze()
        report["loaded"] = counts | {"active_task_instances": args.active_runs * args.active_tasks,
                                     "seconds": round(time.monotonic() - began, 1)}
        print(f"loaded {counts['runs']:,} finished runs ({counts['failed_runs']:,} failed), {counts['task_instances']:,} task instances, "
              f"{counts['attempts']:,} attempts ({counts['failed_attempts']:,} failed) over {args.days:g} days in {copied:.1f} s; "
              f"{args.active_runs * args.active_tasks:,} active task instances; {report['loaded']['seconds']:.1f} s with VACUUM ANALYZE")
        report["floors"] = measure_floors(env)
        if "scheduler" in args.only:
            report["scheduler"] = scheduler_phase(dag, args)
        if "failures" in args.only:
            report["failures"] = failures_phase(args)
        if "clean" in args.only:
            report["clean"] = clean_phase(dag, args, env)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average before {report['load_before']}, after {report['load_after']}")
    for phase in PHASES:
        if phase in report:
            print(f"  {phase:<10} {'PASS' if report[phase]['passed'] else 'MISS'}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2, default=str)
    return 0 if all(report[p]["passed"] for p in PHASES if p in report) else 1


if __name__ == "__main__":
    sys.exit(main())
