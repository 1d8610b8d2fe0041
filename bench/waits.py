"""Benchmark: what 10,000 waiting tasks cost the scheduler, and an event's time to its downstream.

    .venv/bin/python -m bench.waits --backend postgres
    .venv/bin/python -m bench.waits --backend postgres --runs 10 --width 10 --seconds 10   # a quick look

A throwaway PostgreSQL database and a claimed Redis database (removed at the end); the scheduler's
pass runs in this process. Phases, each the same loop as `run_scheduler` (a pass, then a sleep of
ORCHESTRATOR_SCHEDULER_INTERVAL, 1 s by default) for `--seconds` of wall time:

1. baseline: the passes with no task waiting (the same database, before any wait exists);
2. event: `--runs` runs of a DAG of `--width` tasks `wait_for: {event}`, made waiting by the
   scheduler's own passes (`waitstart.begin`); an event wait has no check, only its timeout;
3. time: as many more tasks `wait_for: {time: <a year ahead>}` with poke_interval 60 (the default),
   so every wait is checked once a minute; measured once the first checks have spread out (the
   event waits are ended first, with one broadcast `send_event`, itself timed).

Per phase: this process's CPU time (`time.process_time`) and that of its PostgreSQL backend (its
utime + stime from /proc/PID/stat: the server runs on this machine; pg_stat_statements is not
loaded) per second of wall time, that is % of one core, and the pass's median time.

4. latency: a DAG `wait (event) -> after (python no-op)`, with the phase's waits still in place;
   `waits.send_event` to that DAG's run, timed to `after` being queued (written by the event's own
   advance of the run) and, with `--worker`, to `after` ending success on a real worker
   (`manage.py run_worker default`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import procfs
from bench.stack import NOOP, Processes, child_env, handle_stop_signals, setup_django
from bench.throwaway import claimed_redis, throwaway_postgres


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres",), required=True)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--width", type=int, default=100, help="waiting tasks per run")
    parser.add_argument("--seconds", type=float, default=60.0, help="wall time of each measured phase")
    parser.add_argument("--events", type=int, default=5, help="event -> downstream samples")
    parser.add_argument("--worker", action="store_true", help="also time the downstream to success on a real worker")
    return parser.parse_args()


def backend_pid() -> int:
    from django.db import connection

    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def measure(label: str, seconds: float) -> dict[str, Any]:
    """The scheduler's loop for `seconds`: a pass, then a sleep of the interval."""
    from django.conf import settings

    from orchestrator.engine import scheduler

    interval = float(settings.ORCHESTRATOR_SCHEDULER_INTERVAL)
    scheduler.schedule_once()  # warm
    pid = backend_pid()
    passes: list[float] = []
    cpu0, db0, wall0 = time.process_time(), procfs.cpu_seconds(pid)[0], time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
        began = time.perf_counter()
        scheduler.schedule_once()
        passes.append(time.perf_counter() - began)
        time.sleep(interval)
    wall = time.perf_counter() - wall0
    cpu, db = time.process_time() - cpu0, procfs.cpu_seconds(pid)[0] - db0
    if backend_pid() != pid:
        print("WARNING: the database connection changed during the phase: its server share is wrong")
    figures = {
        "label": label,
        "passes": len(passes),
        "wall": wall,
        "process_pct": 100 * cpu / wall,
        "server_pct": 100 * db / wall,
        "pass_ms": statistics.median(passes) * 1000,
        "pass_max_ms": max(passes) * 1000,
    }
    print(
        f"  {label:<22} {figures['passes']:3d} passes in {wall:5.1f} s: scheduler process {figures['process_pct']:5.2f} % "
        f"+ its PostgreSQL backend {figures['server_pct']:5.2f} % of one core; pass median {figures['pass_ms']:7.1f} ms "
        f"(max {figures['pass_max_ms']:.1f})"
    )
    return figures


def waits_dag(dag_id: str, width: int, wait_for: dict[str, Any], runs: int):
    from orchestrator.models import Dag, Task

    dag = Dag.objects.create(dag_id=dag_id, schedule=None, max_active_runs=runs + 1)
    Task.objects.bulk_create(
        Task(dag=dag, task_id=f"w{i}", wait_for=wait_for, position=i) for i in range(width)
    )
    return dag


def make_waiting(dag, runs: int, expected: int) -> float:
    """`runs` runs of `dag`, made waiting by the scheduler's passes; returns the seconds it took."""
    from django.utils import timezone

    from orchestrator.engine import scheduler
    from orchestrator.engine.run_creation import create_run
    from orchestrator.models import DagRun, TaskInstance
    from retries.states import TaskState

    now = timezone.now()
    for i in range(runs):
        create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now + timedelta(seconds=i), now=now, triggered_by="bench")
    began = time.perf_counter()
    waiting = TaskInstance.objects.filter(dag_run__dag=dag, state=TaskState.UP_FOR_RESCHEDULE)
    while waiting.count() < expected:
        scheduler.schedule_once()
        if time.perf_counter() - began > 1800:
            sys.exit(f"only {waiting.count()} of {expected} tasks waiting after 30 minutes")
    return time.perf_counter() - began


def settle_checks() -> None:
    """Passes until every wait has had its first check (all due at once when begun). Not until
    none is due: the later checks are spread over the poke_interval, so some are always due."""
    from orchestrator.engine import scheduler
    from orchestrator.models import TaskWait

    while TaskWait.objects.filter(checks=0).exists():
        scheduler.schedule_once()


def event_latency(samples: int, worker: bool) -> tuple[list[float], list[float]]:
    """Event -> `after` queued (and -> success with a worker), in seconds, per sample."""
    from django.utils import timezone

    from orchestrator.engine import scheduler, waits
    from orchestrator.engine.run_creation import create_run
    from orchestrator.models import Dag, DagRun, Task, TaskInstance
    from retries.states import TaskState

    dag = Dag.objects.create(dag_id=f"bench_event_latency_{time.time_ns()}", schedule=None, max_active_runs=samples + 1)
    Task.objects.create(dag=dag, task_id="wait", wait_for={"event": {"name": "bench_go"}}, position=0)
    Task.objects.create(dag=dag, task_id="after", python_callable=NOOP, upstream=["wait"], position=1)
    to_queued: list[float] = []
    to_success: list[float] = []
    for i in range(samples):
        now = timezone.now()
        run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now, now=now, triggered_by="bench")
        wait = TaskInstance.objects.filter(dag_run=run, task_id="wait")
        while wait.get().state != TaskState.UP_FOR_RESCHEDULE:
            scheduler.schedule_once()
        sent = time.time()
        delivered = waits.send_event("bench_go", {"sample": i}, dag_id=dag.dag_id, actor="bench")
        assert len(delivered) == 1, delivered
        after = TaskInstance.objects.get(dag_run=run, task_id="after")
        while after.queued_at is None:  # not dispatched by the event's own advance: by the scheduler's next pass
            time.sleep(float(os.environ.get("ORCHESTRATOR_SCHEDULER_INTERVAL", "1")))
            scheduler.schedule_once()
            after.refresh_from_db()
        to_queued.append(time.time() - sent)  # committed and readable (queued or further on)
        if worker:
            deadline = time.time() + 60
            while after.state != TaskState.SUCCESS and time.time() < deadline:
                time.sleep(0.01)
                after.refresh_from_db()
            if after.state != TaskState.SUCCESS:
                sys.exit(f"the downstream task is {after.state} 60 s after its event")
            to_success.append(after.end_date.timestamp() - sent)
        scheduler.schedule_once()  # the run ends
    return to_queued, to_success


def print_latency(label: str, to_queued: list[float], to_success: list[float]) -> None:
    q = ", ".join(f"{s * 1000:.1f}" for s in to_queued)
    print(f"  {label}: event -> downstream queued: median {statistics.median(to_queued) * 1000:.1f} ms ({q})")
    if to_success:
        s = ", ".join(f"{x * 1000:.0f}" for x in to_success)
        print(f"  {label}: event -> downstream success (a real worker): median {statistics.median(to_success) * 1000:.1f} ms ({s})")


def main() -> int:
    args = parse_args()
    handle_stop_signals()
    total = args.runs * args.width
    with ExitStack() as stack:
        server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
        database_url = stack.enter_context(throwaway_postgres(server_url, "waits_bench"))
        redis_url = stack.enter_context(claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="waits-bench-")))
        env = child_env(database_url, redis_url, ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"))
        setup_django(env)
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection
        from django.utils import timezone

        from orchestrator.engine import waits

        call_command("migrate", verbosity=0)
        print(
            f"PostgreSQL {connection.pg_version}; {os.cpu_count()} CPUs; {total} waits ({args.runs} runs x {args.width}); "
            f"interval {settings.ORCHESTRATOR_SCHEDULER_INTERVAL} s; {args.seconds:.0f} s per phase"
        )
        if args.worker:
            processes = Processes(env, workdir)
            stack.callback(processes.stop)
            processes.start("worker", "run_worker", "default")

        baseline = measure("no waits", args.seconds)

        dag = waits_dag("bench_waits_event", args.width, {"event": {"name": "bench_never"}}, args.runs)
        took = make_waiting(dag, args.runs, total)
        print(f"  {total} event waits begun by the scheduler's passes in {took:.1f} s")
        event = measure(f"{total} event waits", args.seconds)
        q, s = event_latency(args.events, args.worker)
        print_latency(f"with {total} event waits", q, s)

        began = time.perf_counter()
        delivered = waits.send_event("bench_never", None, dag_id="bench_waits_event", actor="bench")
        print(f"  one broadcast event ended {len(delivered)} waits in {time.perf_counter() - began:.1f} s")

        far = (timezone.now() + timedelta(days=365)).replace(microsecond=0).isoformat()
        dag = waits_dag("bench_waits_time", args.width, {"time": far}, args.runs)
        took = make_waiting(dag, args.runs, total)
        settle_checks()
        print(f"  {total} time waits begun (and checked once) in {took:.1f} s")
        timed = measure(f"{total} time waits", args.seconds)

        print("\n== % of one core per second of wall time (scheduler process + its PostgreSQL backend):")
        for phase in (event, timed):
            extra = phase["process_pct"] + phase["server_pct"] - baseline["process_pct"] - baseline["server_pct"]
            print(
                f"  {phase['label']:<22} {phase['process_pct'] + phase['server_pct']:6.2f} %  vs no waits "
                f"{baseline['process_pct'] + baseline['server_pct']:6.2f} %  -> the waits' own cost {extra:+.2f} % "
                f"(target < 5 %); pass {phase['pass_ms']:.1f} ms vs {baseline['pass_ms']:.1f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
