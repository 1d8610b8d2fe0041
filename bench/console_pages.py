"""Benchmark: the console's heaviest pages against a large history.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/console_pages.py

Creates a throwaway PostgreSQL database, loads a DAG of `--tasks` tasks with `--runs` runs
(one task instance per task and run), and `--attempts` failed attempts spread over them and
the last 24 hours, with their hourly failure counts (filled as migration 0003 fills them); then
renders, through Django's test client (server time only, no network),

  * the DAG page (the grid of the last 25 runs × all tasks), and its htmx poll,
  * the failures page over 24 hours (every breakdown, the chart, the newest 100 rows),
  * the failures page filtered by reason=poisoned,

each `--repeat` times after one warm-up, printing the median and the worst, and the query count.

`--scale` measures the pages of a 10,000-task DAG instead (`--scale-tasks`, `--scale-runs` runs of
it, one task instance per task and run, written by the database itself) and of a task mapped over
`--scale-tasks` items: the DAG page (its grid pages the tasks), the run page (200 tasks a page),
the mapped task's page (counts by state and 200 instances a page), each with its second page.
Floor of the same run: `SELECT 1` through the test client's database connection, and the
dead-letters page (a page that reads nothing of the DAG).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throwaway import claimed_redis, throwaway_postgres


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--attempts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--scale", action="store_true", help="the pages of a 10,000-task DAG and of a 10,000-instance mapped task")
    parser.add_argument("--scale-tasks", type=int, default=10_000)
    parser.add_argument("--scale-runs", type=int, default=25)
    parser.add_argument("--profile", action="store_true", help="with --scale: cProfile of the DAG page")
    return parser.parse_args()


def load(tasks: int, runs: int, attempts: int) -> None:
    import random

    from django.db import connection
    from django.utils import timezone

    from orchestrator.engine import failure_counts
    from orchestrator.models import Dag, DagRun, Task, TaskAttempt, TaskInstance

    now = timezone.now()
    dag = Dag.objects.create(dag_id="bench", paused=True)
    Task.objects.bulk_create(Task(dag=dag, task_id=f"t{i:02d}", python_callable="examples.etl.extract", upstream=[f"t{i - 1:02d}"] if i else [], position=i) for i in range(tasks))
    DagRun.objects.bulk_create(
        (DagRun(dag=dag, run_id=f"bench__{i:05d}", state="success" if i < runs - 1 else "running", logical_date=now - timedelta(minutes=runs - i),
                queued_at=now - timedelta(minutes=runs - i), start_date=now - timedelta(minutes=runs - i), end_date=None if i == runs - 1 else now - timedelta(minutes=runs - i - 1))
         for i in range(runs)),
        batch_size=5000,
    )
    states = ["success"] * 8 + ["failed", "dead_letter"]
    rng = random.Random(7)
    TaskInstance.objects.bulk_create(
        (TaskInstance(dag_run_id=run_pk, task_id=f"t{i:02d}", state=rng.choice(states), try_number=1, max_tries=2,
                      last_failure_context={"category": "application", "reason": "poisoned", "source": "scheduler", "metadata": {}})
         for run_pk in DagRun.objects.values_list("pk", flat=True) for i in range(tasks)),
        batch_size=5000,
    )
    ti_ids = list(TaskInstance.objects.values_list("pk", flat=True))
    reasons = [("application", "task_exception"), ("infrastructure", "worker_lost"), ("timeout", "execution_timeout")]
    batch = []
    for n in range(attempts):
        category, reason = rng.choice(reasons)
        end = now - timedelta(seconds=rng.uniform(0, 86_000))
        batch.append(TaskAttempt(
            task_instance_id=rng.choice(ti_ids), attempt_token=n + 1, try_number=1, infrastructure_try_number=0,
            kind="user", state="failed", queued_at=end - timedelta(seconds=5), start_date=end - timedelta(seconds=4), end_date=end,
            context={"category": category, "reason": reason, "source": "worker", "metadata": {"exception_type": "ValueError", "message": f"bad row {n % 97}"}},
            fingerprint=f"{n % 40:012x}" if category == "application" else None, hostname=f"host-{n % 8}", worker_name=f"w-{n % 16}",
            stderr="Traceback (most recent call last):\n" * 20 + f"ValueError: bad row {n % 97}\n",
        ))
        if len(batch) == 10_000:
            TaskAttempt.objects.bulk_create(batch)
            batch = []
    TaskAttempt.objects.bulk_create(batch)
    # bulk_create bypasses the writes that keep the hourly failure counts: fill them the way
    # the migration does for a history that existed before them.
    failure_counts.backfill()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _insert_instances(select: str, params: list, overrides: dict[str, str]) -> None:
    """Task instances written by the database itself: `select` gives the rows (aliases r, t,
    g); each column is its `overrides` SQL, else the field's default as a parameter."""
    from django.db import connection

    from orchestrator.data import sql
    from orchestrator.models import TaskInstance

    fields = [field for field in sql.concrete_fields(TaskInstance) if not field.primary_key]
    columns, values, constants = [], [], []
    for field in fields:
        columns.append(connection.ops.quote_name(field.column))
        if field.name in overrides:
            values.append(overrides[field.name])
        else:
            default = field.pre_save(TaskInstance(), True) if field.name == "updated_at" else field.get_default()
            values.append("%s")
            constants.append(field.get_db_prep_save(default, connection))
    sql.execute(f"INSERT INTO orchestrator_taskinstance ({', '.join(columns)}) SELECT {', '.join(values)} {select}", [*constants, *params])


def load_scale(tasks: int, runs: int) -> dict[str, str]:
    """A DAG of `tasks` tasks (layers of fan-out and fan-in) with `runs` runs, one task instance
    per task and run, and a DAG whose one task is mapped over `tasks` items, with one run;
    states spread so that the pages have something to count. Returns the pages' URLs."""
    from urllib.parse import quote

    from django.db import connection
    from django.utils import timezone

    from bench.big_dag import big_dag
    from orchestrator.models import Dag, DagRun, Task

    now = timezone.now()
    dag = Dag.objects.create(dag_id="big", paused=True)
    specs = big_dag("big", tasks, 1000)["tasks"]
    Task.objects.bulk_create([Task(dag=dag, task_id=t["task_id"], python_callable=t["python_callable"], upstream=t["upstream"], position=i)
                              for i, t in enumerate(specs)], batch_size=2000)
    DagRun.objects.bulk_create([DagRun(dag=dag, run_id=f"big__{i:03d}", state="success" if i < runs - 1 else "running",
                                       logical_date=now - timedelta(hours=runs - i), queued_at=now - timedelta(hours=runs - i),
                                       start_date=now - timedelta(hours=runs - i)) for i in range(runs)])
    states = "(ARRAY['success','success','success','failed','running','none','upstream_failed'])[1 + (t.id %% 7)]"
    _insert_instances("FROM orchestrator_task t JOIN orchestrator_dagrun r ON r.dag_id = t.dag_id WHERE t.dag_id = %s",
                      [dag.pk], {"dag_run": "r.id", "definition": "t.id", "task_id": "t.task_id", "state": states, "try_number": "1"})
    mapped = Dag.objects.create(dag_id="mapped", paused=True)
    load = Task.objects.create(dag=mapped, task_id="load", python_callable="bench.tasks.noop_item", expand={"item": list(range(tasks))})
    run = DagRun.objects.create(dag=mapped, run_id="mapped__1", state="running", logical_date=now, queued_at=now, start_date=now)
    states = "(ARRAY['success','success','success','failed','running','queued','dead_letter'])[1 + (g.i %% 7)]"
    _insert_instances("FROM generate_series(0, %s) AS g(i)", [tasks - 1],
                      {"dag_run": str(run.pk), "definition": str(load.pk), "task_id": "'load'", "map_index": "g.i",
                       "map_item": "to_jsonb(g.i)", "state": states, "try_number": "1"})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    last = DagRun.objects.filter(dag=dag).order_by("-queued_at").first()
    run_url = f"/dags/big/runs/{quote(last.run_id, safe='')}/"
    mapped_url = f"/dags/mapped/runs/{quote(run.run_id, safe='')}/tasks/load"
    return {
        f"DAG page, grid {runs} runs x {tasks} tasks (page 1)": "/dags/big/",
        "DAG page, grid page 2": "/dags/big/?grid_page=2",
        f"run page of {tasks} tasks (page 1)": run_url,
        "run page, page 2": run_url + "?page=2",
        f"mapped task page, {tasks} instances (page 1)": mapped_url,
        "mapped task page, failed, page 2": mapped_url + "?state=failed&page=2",
    }


def timed(client, url: str, repeat: int, **headers) -> tuple[float, float, int, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url, **headers)  # warm-up: template compilation, connection
    times = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url, **headers)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times), len(queries), response.status_code


def main() -> None:
    args = parse_args()
    server_url = os.environ.get("DATABASE_URL", "")
    with throwaway_postgres(server_url, "console_bench", keep=args.keep) as db_url, claimed_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")) as redis_url:
        os.environ["DATABASE_URL"] = db_url
        os.environ["REDIS_URL"] = redis_url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
        os.environ.setdefault("SECRET_KEY", "bench-only")
        os.environ["LOG_LEVEL"] = "ERROR"
        os.environ["SECURE_SSL_REDIRECT"] = "false"  # the test client speaks plain HTTP
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client

        settings.ALLOWED_HOSTS = ["*"]
        call_command("migrate", verbosity=0)
        if args.scale:
            scale(args)
            return
        started = time.perf_counter()
        load(args.tasks, args.runs, args.attempts)
        print(f"loaded {args.runs} runs × {args.tasks} tasks and {args.attempts} failed attempts in {time.perf_counter() - started:.1f} s")
        client = Client()
        client.force_login(User.objects.create_user("bench"))
        for label, url, headers in [
            (f"DAG page, grid 25 runs × {args.tasks} tasks", "/dags/bench/", {}),
            ("DAG grid htmx poll", "/dags/bench/", {"HTTP_HX_REQUEST": "true"}),
            ("failures page, 24 h", "/failures/?window=24h", {}),
            ("failures page, reason=poisoned", "/failures/?window=24h&reason=poisoned", {}),
            ("dead letters page", "/dead-letters/", {}),
        ]:
            median, worst, queries, status = timed(client, url, args.repeat, **headers)
            print(f"| {label} | {median:.0f} ms | {worst:.0f} ms | {queries} | {status} |")




def scale(args: argparse.Namespace) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    started = time.perf_counter()
    pages = load_scale(args.scale_tasks, args.scale_runs)
    print(f"loaded {args.scale_runs} runs x {args.scale_tasks} tasks and a task mapped over {args.scale_tasks} items"
          f" in {time.perf_counter() - started:.1f} s; load average {os.getloadavg()[0]:.1f}")
    client = Client()
    client.force_login(User.objects.create_superuser("bench"))
    floor = []
    for _ in range(args.repeat):
        began = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        floor.append((time.perf_counter() - began) * 1000)
    print(f"| floor: SELECT 1 | {statistics.median(floor):.1f} ms | {max(floor):.1f} ms | 1 | - |")
    median, worst, queries, status = timed(client, "/dead-letters/", args.repeat)
    print(f"| floor: dead letters page (none) | {median:.0f} ms | {worst:.0f} ms | {queries} | {status} |")
    for label, url in pages.items():
        median, worst, queries, status = timed(client, url, args.repeat)
        print(f"| {label} | {median:.0f} ms | {worst:.0f} ms | {queries} | {status} |")
        if url.startswith("/dags/big/?") or url == "/dags/big/":
            median, worst, queries, status = timed(client, url, args.repeat, HTTP_HX_REQUEST="true")
            print(f"| {label}: the grid alone (its htmx poll) | {median:.0f} ms | {worst:.0f} ms | {queries} | {status} |")
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        client.get("/dags/big/")
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats("orchestrator|deadlines", 25)
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
