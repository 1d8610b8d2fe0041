"""A chain's step as the database sees it, in one process: the claim, the "running" handshake and
the success report (which settles and dispatches the next task) of one task of a chain, each
timed alone, without workers, fork servers or task processes around them.

    .venv/bin/python -m bench.chain_step [--steps 200] [--no-prepared] [--handover]

Whole-stack figures (`python -m bench --only chain-seen`) move by several milliseconds from one
run to the next on a shared machine; these three calls, repeated a few hundred times in one
process, give a median steady enough to compare two builds or settings back to back. Uses a
throwaway PostgreSQL database and Redis database (the dispatch's job goes to Redis). Prints the
median of each call, their sum, and beside them the floor of the same run: the median round
trip of `SELECT 1` on the same connection. With `--handover` the report is made as a worker
makes it, offering its slot (`engine/handover.py`): the next task is claimed in the report's
transaction, and a step is the handshake and that report.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.stack import handle_stop_signals
from bench.throwaway import migrated_django

WARM_UP = 10  # steps left out of the figures: the connection's first statements, caches filling


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chain_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="chain steps to time (default 200)")
    parser.add_argument("--no-prepared", action="store_true", help="with ORCHESTRATOR_DB_PREPARED_STATEMENTS=false")
    parser.add_argument("--handover", action="store_true", help="reports offer their slot: the next task is claimed with the report")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    if args.no_prepared:
        os.environ["ORCHESTRATOR_DB_PREPARED_STATEMENTS"] = "false"
    load_before = os.getloadavg()
    with migrated_django("chain_step_bench"):
        times = time_handed_steps(args.steps) if args.handover else time_steps(args.steps)
    print(f"load average before {[round(x, 2) for x in load_before]}, after {[round(x, 2) for x in os.getloadavg()]}")
    print(f"prepared statements: {'off' if args.no_prepared else 'on'}; hand-over: {'on' if args.handover else 'off'};"
          f" {args.steps} steps")
    floor = statistics.median(times.pop("select 1"))
    for name, values in times.items():
        print(f"  {name:<28} {statistics.median(values) * 1000:7.2f} ms median")
    step = sum(statistics.median(values) for values in times.values())
    print(f"  {'a step (their sum)':<28} {step * 1000:7.2f} ms")
    print(f"  floor: SELECT 1 round trip   {floor * 1000:7.3f} ms median")
    return 0


def _chain_dag(steps: int) -> Any:
    from orchestrator.models import Dag, Task

    dag = Dag.objects.create(dag_id="chain_step", max_active_runs=steps + WARM_UP + 1)
    for position, (task_id, upstream) in enumerate([("a", []), ("b", ["a"]), ("c", ["b"])]):
        Task.objects.create(dag=dag, task_id=task_id, python_callable="bench.tasks.sleep", op_kwargs={"seconds": 0},
                            upstream=upstream, position=position)
    return dag


def time_steps(steps: int) -> dict[str, list[float]]:
    """Each step: a run of a -> b -> c; a is claimed, marked running and reported successful,
    which makes b ready and dispatches it, as in a chain."""
    from orchestrator.engine import reporting
    from orchestrator.engine.run_creation import create_manual_run
    from orchestrator.models import TaskInstance

    dag = _chain_dag(steps)
    worker = reporting.WorkerInfo(hostname="bench", worker_name="bench-chain-step", pid=os.getpid())
    times: dict[str, list[float]] = {"claim": [], "handshake (running)": [], "success report": [], "select 1": []}
    for step in range(steps + WARM_UP):
        run = create_manual_run(dag)
        ti = TaskInstance.objects.get(dag_run=run, task_id="a")
        _time_calls(times, step, [
            functools.partial(reporting.claim, ti.pk, ti.attempt_token, worker),
            functools.partial(reporting.mark_running, ti.pk, ti.attempt_token, pid=os.getpid(), has_start_deadlines=False),
            functools.partial(reporting.report_success, ti.pk, ti.attempt_token),
        ])
    return times


def time_handed_steps(steps: int) -> dict[str, list[float]]:
    """Each step: a run of a -> b -> c; a is claimed, started and reported with an offer (which
    claims b), untimed; then b's handshake and its report with an offer (which claims c)."""
    from orchestrator.engine import handover, reporting
    from orchestrator.engine.run_creation import create_manual_run
    from orchestrator.models import TaskInstance

    dag = _chain_dag(steps)
    worker = reporting.WorkerInfo(hostname="bench", worker_name="bench-chain-step", pid=os.getpid())

    def report_offering(task_instance_id: int, token: int) -> Any:
        offer = handover.Offer(lambda: frozenset({"default"}), functools.partial(reporting.claim_within, worker=worker))
        with handover.offering(offer):
            assert reporting.report_success(task_instance_id, token)
        assert offer.taken is not None
        return offer.taken

    times: dict[str, list[float]] = {"handshake (running)": [], "success report (+ next claim)": [], "select 1": []}
    for step in range(steps + WARM_UP):
        run = create_manual_run(dag)
        a = TaskInstance.objects.get(dag_run=run, task_id="a")
        assert reporting.claim(a.pk, a.attempt_token, worker)
        assert reporting.mark_running(a.pk, a.attempt_token, pid=os.getpid(), has_start_deadlines=False)
        b = report_offering(a.pk, a.attempt_token)
        _time_calls(times, step, [
            functools.partial(reporting.mark_running, b.pk, b.attempt_token, pid=os.getpid(), has_start_deadlines=b.has_start_deadlines),
            functools.partial(report_offering, b.pk, b.attempt_token),
        ])
    return times


def _time_calls(times: dict[str, list[float]], step: int, calls: list[Callable[[], Any]]) -> None:
    """Make `calls` one after another (each must succeed), then a `SELECT 1` round trip, and add
    each one's time to `times` (its keys in the same order) once past the warm-up."""
    from django.db import connection

    marks = [time.perf_counter()]
    for call in calls:
        assert call()
        marks.append(time.perf_counter())
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    marks.append(time.perf_counter())
    if step >= WARM_UP:
        for name, began, ended in zip(times, marks, marks[1:]):
            times[name].append(ended - began)


if __name__ == "__main__":
    sys.exit(main())
