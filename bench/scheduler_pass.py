"""The scheduler's pass, timed in-process: `schedule_once()` over many unfinished runs that have
nothing to do, with no scheduler or worker running (the cost every scheduler pays per pass)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import timedelta
from functools import partial
from typing import Any

from bench.stack import make_dag

# What a task instance of a populated run is: a state the pass reads and must leave alone.
RUNNING = "running"  # its task process said "running"; fresh heartbeat
CLAIMED = "claimed"  # queued, a worker took the job (fresh heartbeat), no handshake yet
QUEUED = "queued"  # queued, its RQ job waits in Redis for a worker
WAITING = "waiting"  # none: its upstream has not finished


def populate(dag_id: str, tasks: dict[str, list[str]], kinds: dict[str, str], runs: int):
    """A DAG of `tasks` (task_id -> upstream) and `runs` running runs of it, each task instance
    as `kinds` says; QUEUED ones get a real RQ job. Returns the DAG."""
    from django.utils import timezone

    from orchestrator.engine.dispatch import enqueue
    from orchestrator.models import DagRun, TaskInstance
    from retries.states import RunState, TaskState

    dag = make_dag(dag_id, tasks, bash="true", max_active_runs=runs + 1)
    definitions = {t.task_id: t for t in dag.tasks.all()}
    now = timezone.now()
    created = DagRun.objects.bulk_create(
        [
            DagRun(dag=dag, run_id=f"{dag_id}__{i}", run_type=DagRun.RunType.MANUAL, state=RunState.RUNNING,
                   logical_date=now + timedelta(microseconds=i), queued_at=now, start_date=now)
            for i in range(runs)
        ],
        batch_size=500,
    )
    state_of = {RUNNING: TaskState.RUNNING, CLAIMED: TaskState.QUEUED, QUEUED: TaskState.QUEUED, WAITING: TaskState.NONE}
    instances = []
    for run in created:
        for task_id, definition in definitions.items():
            kind = kinds[task_id]
            dispatched = kind != WAITING
            instances.append(
                TaskInstance(
                    dag_run=run, definition=definition, task_id=task_id, state=state_of[kind],
                    attempt_token=1 if dispatched else 0, try_number=1 if dispatched else 0,
                    queued_at=now if dispatched else None,
                    start_date=now if kind == RUNNING else None,
                    heartbeat_at=now if kind in (RUNNING, CLAIMED) else None,
                    worker_name="bench-worker" if kind in (RUNNING, CLAIMED) else "",
                )
            )
    TaskInstance.objects.bulk_create(instances, batch_size=2000)
    for ti in TaskInstance.objects.filter(dag_run__dag=dag, state=TaskState.QUEUED, heartbeat_at__isnull=True):
        enqueue(ti.queue, ti.pk, ti.attempt_token)
    return dag


def refresh_heartbeats(dag) -> None:
    """Every heartbeat of the DAG's task instances fresh, so that a pass finds nothing lost."""
    from orchestrator.foundation.clock import Now
    from orchestrator.models import TaskInstance

    TaskInstance.objects.filter(dag_run__dag=dag, heartbeat_at__isnull=False).update(heartbeat_at=Now())


def time_passes(dag, repeats: int = 5, steps: bool = True) -> dict[str, Any]:
    """Time `repeats` passes of schedule_once(), each step of one more pass (unless not `steps`),
    and the queries of the last; heartbeats are refreshed before each pass so that nothing is lost."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from orchestrator.engine import scheduler
    from orchestrator.foundation.clock import Now
    from orchestrator.models import TaskInstance

    beating = TaskInstance.objects.filter(dag_run__dag=dag, heartbeat_at__isnull=False)

    def timed(step: Callable[[], Any], count_queries: bool = False) -> tuple[float, list[dict[str, str]], Any]:
        beating.update(heartbeat_at=Now())  # fresh, so the pass finds no lost task
        connection.queries_log.clear()
        with ExitStack() as stack:
            capture = stack.enter_context(CaptureQueriesContext(connection)) if count_queries else None
            began = time.perf_counter()
            result = step()
            elapsed = time.perf_counter() - began
        return elapsed, list(capture.captured_queries) if capture else [], result

    timed(scheduler.schedule_once)  # warm: the first pass of a process pays for imports and plans
    # The last pass also records its queries (and their time): a small cost next to the pass.
    passes = [timed(scheduler.schedule_once, count_queries=n == repeats - 1) for n in range(repeats)]
    changed = [r for _, _, r in passes if r.tasks_dispatched or r.runs_finished or r.runs_created or r.lost]
    if changed:
        print(f"WARNING: a pass with nothing to do changed something: {changed[0]}")
    queries = passes[-1][1]
    at = timezone.now()
    step_ms = {}
    for step in () if not steps else (scheduler._create_due_runs, scheduler._evaluate_circuits, scheduler._advance_unfinished_runs, scheduler._find_lost_tasks):
        samples = [timed(partial(step, at, scheduler.PassReport()))[0] for _ in range(repeats)]
        step_ms[step.__name__.lstrip("_")] = round(statistics.median(samples) * 1000, 2)
    return {
        "pass_ms": statistics.median(p[0] for p in passes) * 1000,
        "pass_min_ms": min(p[0] for p in passes) * 1000,
        "passes": repeats,
        "queries": len(queries),
        # SQLite reads rows after execute() returns, so only PostgreSQL's query times add up.
        "sql_ms": sum(float(q["time"]) for q in queries) * 1000 if connection.vendor == "postgresql" else None,
        "steps_ms": step_ms,
        "statements": sorted(((round(float(q["time"]) * 1000, 1), q["sql"]) for q in queries), reverse=True),
        "changed": bool(changed),
    }


def print_passes(title: str, figures: dict[str, Any], runs: int) -> None:
    sql = f", {figures['sql_ms']:.0f} ms of it in the database calls" if figures["sql_ms"] is not None else ""
    print(
        f"\n== {title} (median of {figures['passes']} passes):\n"
        f"  schedule_once()                 {figures['pass_ms']:9.1f} ms  (min {figures['pass_min_ms']:.1f}; "
        f"{figures['pass_ms'] / max(runs, 1):.2f} ms per run)\n"
        f"    queries in one pass           {figures['queries']:9d}{sql}"
    )
    for name, ms in figures["steps_ms"].items():
        print(f"    {name:<29} {ms:9.1f} ms")
