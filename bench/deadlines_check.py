"""Benchmark: the periodic deadline check against a table of a million deadlines.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/deadlines_check.py --rows 1000000

DATABASE_URL names a PostgreSQL server (any database on it): the script creates a throwaway
database there, migrates it, loads `--rows` pending deadlines with COPY (a `--due` fraction of
them already past need-by, the rest up to 30 days ahead), and times

  * the due query's plan (EXPLAIN ANALYZE: it must use the partial index `deadline_due`),
  * one check pass (`check_due(now, limit)`: claim a batch, mark it missed, queue callbacks),
  * draining the whole due backlog batch by batch, as run_scheduler does,
  * an idle pass once nothing is due: the cost paid every ORCHESTRATOR_DEADLINE_CHECK_INTERVAL.

Callback jobs go to an empty Redis database claimed for the run (REDIS_URL's server, databases
1-15) and flushed at the end; the throwaway Postgres database is dropped at the end too.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throwaway import claimed_redis, throwaway_postgres


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="deadline rows to load (default 1000000)")
    parser.add_argument("--due", type=float, default=0.01, help="fraction already past need-by (default 0.01)")
    parser.add_argument("--runs", type=int, default=0, help="DAG runs the rows belong to (default rows/100)")
    parser.add_argument("--limit", type=int, default=500, help="batch size of one check pass (default 500)")
    parser.add_argument("--keep", action="store_true", help="keep the database (prints its URL) instead of dropping it")
    return parser.parse_args()


def load(rows: int, runs: int, due_fraction: float, now: datetime) -> int:
    """COPY `rows` pending deadlines spread over `runs` running DAG runs; return how many are due."""
    from django.db import connection

    from deadlines.models import Deadline
    from orchestrator.models import Dag, DagRun

    dag = Dag.objects.create(dag_id="bench", paused=True)
    started = now - timedelta(hours=2)
    DagRun.objects.bulk_create(
        (DagRun(dag=dag, run_id=f"bench__{i}", state="running", logical_date=started, queued_at=started) for i in range(runs)),
        batch_size=5000,
    )
    run_ids = list(DagRun.objects.values_list("pk", flat=True))
    rng = random.Random(42)
    due = 0
    columns = ("dag_run_id", "scope", "reference", "callback", "callback_kwargs", "warn", "need_by", "state",
               "callback_attempts", "callback_error")
    table = Deadline._meta.db_table
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for i in range(rows):
                if rng.random() < due_fraction:
                    need_by = now - timedelta(seconds=rng.uniform(1, 3600))
                    due += 1
                else:
                    need_by = now + timedelta(seconds=rng.uniform(60, 30 * 86400))
                copy.write_row((run_ids[i % len(run_ids)], "dag", "dagrun_queued_at", "notifier:log", "{}", False, need_by,
                                "pending", 0, ""))
        cursor.execute(f"ANALYZE {table}")
    return due


def timed(label: str, fn, *args):
    started = time.perf_counter()
    result = fn(*args)
    elapsed = time.perf_counter() - started
    print(f"{label:<44} {elapsed * 1000:10.1f} ms   -> {result}")
    return result, elapsed


def main() -> None:
    server_url = os.environ.get("DATABASE_URL", "")
    if not server_url:
        sys.exit("set DATABASE_URL to a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/postgres")
    with throwaway_postgres(server_url, "deadline_bench", keep=ARGS.keep) as db_url, claimed_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")) as redis_url:
        os.environ["DATABASE_URL"] = db_url
        os.environ["REDIS_URL"] = redis_url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
        os.environ.setdefault("SECRET_KEY", "bench-only")
        os.environ["LOG_LEVEL"] = "ERROR"  # one log line per miss would time the terminal, not the check
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, transaction

        from deadlines.check import check_due, claim_query
        from deadlines.models import Deadline

        call_command("migrate", verbosity=0)
        runs = ARGS.runs or max(1, ARGS.rows // 100)
        now = datetime.now(dt_timezone.utc)
        print(f"PostgreSQL {connection.pg_version}, {ARGS.rows:,} deadlines over {runs:,} runs, due fraction {ARGS.due}")
        due, load_seconds = timed("load (COPY + ANALYZE)", load, ARGS.rows, runs, ARGS.due, now)
        print(f"{due:,} deadlines due, {ARGS.rows - due:,} in the future")

        with transaction.atomic():  # the claiming query locks rows: it needs a transaction
            plan = claim_query(now, ARGS.limit).explain(analyze=True, buffers=True)
            transaction.set_rollback(True)
        print("\nclaiming query plan (EXPLAIN ANALYZE):\n" + plan + "\n")
        if "deadline_due" not in plan:
            print("WARNING: the due query did not use the index deadline_due")

        check_time = now + timedelta(seconds=1)
        first, first_seconds = timed(f"one check pass (limit {ARGS.limit})", check_due, check_time, ARGS.limit)
        batches, handled = 1, first
        drain_started = time.perf_counter()
        while True:
            n = check_due(check_time, ARGS.limit)
            handled += n
            batches += 1
            if n < ARGS.limit:
                break
        drain_seconds = time.perf_counter() - drain_started + first_seconds
        print(f"{'drain the backlog':<44} {drain_seconds * 1000:10.1f} ms   -> {handled:,} rows in {batches} passes "
              f"({handled / drain_seconds:,.0f} rows/s)")
        idle = [timed("idle pass (nothing due)", check_due, check_time, ARGS.limit)[1] for _ in range(3)]
        missed = Deadline.objects.filter(state="missed").count()
        from rq import Queue

        from orchestrator.foundation.redis_conn import get_redis

        jobs = Queue("default", connection=get_redis()).count
        print(f"\nmissed rows: {missed:,} (expected {due:,}); callback jobs queued: {jobs:,}")
        print(f"summary: rows={ARGS.rows} due={due} load_s={load_seconds:.1f} first_pass_ms={first_seconds * 1000:.1f} "
              f"drain_s={drain_seconds:.2f} idle_pass_ms={min(idle) * 1000:.2f}")
        if ARGS.keep:
            print(f"kept database: {db_url}")
        if missed != due or jobs != due:
            sys.exit("FAILED: every due deadline should be missed exactly once with one callback job")


if __name__ == "__main__":
    ARGS = parse_args()
    main()
