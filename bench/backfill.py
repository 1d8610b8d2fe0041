"""python -m bench.backfill: a 1,000-date backfill of a 10-task DAG.

    .venv/bin/python -m bench.backfill                       # 1,000 hourly dates, 50 runs at once
    .venv/bin/python -m bench.backfill --dates 200 --max-active-runs 20

Measures the time to check and create the backfill (every date planned against the DAG's runs,
one INSERT of its dates), the time of its dry run, and, with one real scheduler and --workers
real workers, how many of its runs complete per second from creation to the backfill's end, and
the most of its runs seen queued or running at once (never above --max-active-runs). The floor
of the same run: --floor-runs manual runs of the same DAG, queued at once and started by the
scheduler under the DAG's own max_active_runs (the same number), run by the same workers.

Like `python -m bench`, it works in a throwaway PostgreSQL database on DATABASE_URL's server and
an empty Redis database on REDIS_URL's, removed at the end. The DAG: extract -> 8 transforms ->
load, python no-op tasks.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.stack import Processes, child_env, handle_stop_signals, make_dag, setup_django, trigger, wait_for_rq_workers, wait_for_runs
from bench.throwaway import claimed_redis, throwaway_postgres

ORIGINAL_ENV = dict(os.environ)
TASKS = {"extract": [], **{f"transform_{i}": ["extract"] for i in range(8)}, "load": [f"transform_{i}" for i in range(8)]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.backfill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dates", type=int, default=1000, help="hourly dates to backfill (default 1000)")
    parser.add_argument("--max-active-runs", type=int, default=50, help="the backfill's runs at once (default 50)")
    parser.add_argument("--workers", type=int, default=2, help="run_worker processes (default 2)")
    parser.add_argument("--floor-runs", type=int, default=200, help="manual runs of the floor (default 200; 0: none)")
    parser.add_argument("--interval", type=float, default=0.2, help="ORCHESTRATOR_SCHEDULER_INTERVAL (default 0.2)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the backfill (default 3600)")
    parser.add_argument("--json", type=Path, default=Path("bench-backfill.json"), help="where to write the figures")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, processes: Processes) -> dict[str, Any]:
    from datetime import UTC, datetime, timedelta

    from orchestrator.models import Backfill, DagRun
    from orchestrator.operations import backfills

    dag = make_dag("backfill_bench", TASKS, max_active_runs=args.max_active_runs)
    dag.schedule = "@hourly"
    dag.save()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = start + timedelta(hours=args.dates - 1)
    figures: dict[str, Any] = {"dates": args.dates, "tasks_per_run": len(TASKS), "max_active_runs": args.max_active_runs}

    began = time.perf_counter()
    request = backfills.check(dag, start=start.isoformat(), end=end.isoformat(), max_active_runs=args.max_active_runs)
    planned = backfills.preview(request)
    figures["dry_run_s"] = round(time.perf_counter() - began, 3)
    assert len(planned) == args.dates, len(planned)

    began = time.perf_counter()
    request = backfills.check(dag, start=start.isoformat(), end=end.isoformat(), max_active_runs=args.max_active_runs)
    backfill = backfills.create(request, None, created_by="bench")
    figures["create_s"] = round(time.perf_counter() - began, 3)
    created = time.monotonic()

    peak = 0
    deadline = created + args.timeout
    while True:
        backfill.refresh_from_db()
        active = DagRun.objects.filter(backfill=backfill, state__in=["queued", "running"]).count()
        peak = max(peak, active)
        if backfills.is_over(backfill):
            break
        processes.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"backfill not over after {args.timeout:.0f}s: {backfills.document(backfill)['runs']}")
        time.sleep(0.2)
    elapsed = time.monotonic() - created
    doc = backfills.document(Backfill.objects.get(pk=backfill.pk))
    figures.update(
        state=doc["state"],
        runs=doc["runs"],
        wall_s=round(elapsed, 1),
        runs_per_s=round(doc["runs"]["success"] / elapsed, 2),
        tasks_per_s=round(doc["runs"]["success"] * len(TASKS) / elapsed, 1),
        peak_active_runs=peak,
    )
    if args.floor_runs:
        run_ids, committed = trigger(dag, args.floor_runs)
        began = time.monotonic()
        wait_for_runs(run_ids, processes, args.timeout)
        floor_elapsed = time.monotonic() - began
        figures["floor"] = {
            "runs": args.floor_runs,
            "wall_s": round(floor_elapsed, 1),
            "runs_per_s": round(args.floor_runs / floor_elapsed, 2),
            "tasks_per_s": round(args.floor_runs * len(TASKS) / floor_elapsed, 1),
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        (workdir / "logs").mkdir()
        server_url = ORIGINAL_ENV.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
        database_url = stack.enter_context(throwaway_postgres(server_url, "bench_backfill"))
        redis_url = stack.enter_context(claimed_redis(ORIGINAL_ENV.get("REDIS_URL") or "redis://127.0.0.1:6379"))
        env = child_env(database_url, redis_url, args.interval, ORCHESTRATOR_PRELOAD_MODULES="bench.tasks",
                        ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"))  # fmt: skip
        setup_django(env)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        processes = Processes(env, workdir / "logs")
        stack.callback(processes.stop)
        names = [f"bench-backfill-{os.getpid()}-{i}" for i in range(args.workers)]
        for name in names:
            processes.start(f"worker-{name}", "run_worker", "--name", name)
        processes.start("scheduler", "run_scheduler")
        wait_for_rq_workers(names, processes)
        figures = run(args, processes)
        figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(figures, indent=2))
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
