"""A fan-out of failing tasks through real workers, with an alert rule matching every failure
against no rules: what alerting costs the workers' reports end to end, and how many
notifications a storm of failures from one cause sends.

    .venv/bin/python -m bench.alert_fanout [--tasks 200] [--rounds 3] [--workers 2]

Starts a real `run_scheduler` (whose sender threads count the queued events in their incidents
and send the notifications) and `--workers` real `run_worker` processes on a throwaway
PostgreSQL database and a claimed Redis database (removed at the end, the processes stopped).
Each phase triggers one run of a DAG of `--tasks` independent python tasks that each raise
`KeyError('customer_id')` once (`retries: 0`: one failed attempt each, the run failed), and
waits for the run's end: `--tasks` failed attempts from one cause within a few seconds.

Phase "no rules": the alert rules table is empty. Phase "rule": one rule, `when: task_failed`,
no filters (every failure matches), `group_by: [category, reason]`, `notify: notifier:log`,
created before the phase and deleted after it (each change followed by the processes' rule
cache period, so every worker sees it). The two phases alternate for `--rounds` rounds (no rules
first in even rounds, the rule first in odd ones), so load from elsewhere on the machine reaches
both alike. For each rule phase: the time from the run's end until the sender had counted every
event, the incidents and notifications (one each expected) and the notifications sent.

Figures per phase: the wall time (trigger -> the run seen over, polled every 0.1 s), failed
attempts per second, the worker's busy time per job (RQ's started_at -> ended_at: claim, task
process, the failure report) and the machine's 1-minute load average at the phase's start.
Floors of the same run: `python -c pass` and the median round trip of `SELECT 1`.
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
from typing import Any

from bench import floors
from bench.stack import Processes, child_env, handle_stop_signals, make_dag, setup_django
from bench.throwaway import claimed_redis, throwaway_postgres

NONE, RULE = "no rules", "rule"
FAIL = "bench.tasks.fail"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.alert_fanout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="failing tasks of the fan-out (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two phases, alternating (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="run_worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one run (default 300)")
    args = parser.parse_args(argv)
    if min(args.tasks, args.rounds, args.workers) < 1:
        parser.error("the sizes must be at least 1")
    args.concurrency = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    load_before = os.getloadavg()
    phases: list[dict[str, Any]] = []
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="bench-alert-fanout-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        (workdir / "logs").mkdir()
        server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
        database_url = stack.enter_context(throwaway_postgres(server_url, "alert_fanout_bench"))
        redis_url = stack.enter_context(claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"))
        env = child_env(database_url, redis_url, ORCHESTRATOR_PRELOAD_MODULES="bench.tasks",
                        ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"))
        setup_django(env)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        processes = Processes(env, workdir / "logs")
        stack.callback(processes.stop)
        python_floor = floors.python_startup(10, env)
        from bench import workloads

        ctx = workloads.Context(args=args, processes=processes, workdir=workdir, original_env=dict(os.environ))
        workloads.ensure_stack(ctx, None)  # the scheduler and the workers, warm
        dag = _failing_dag("alert_fanout", args.tasks)
        _run_phase(ctx, dag, "warm-up")  # untimed: the first failures of each worker
        for n in range(args.rounds):
            for side in (NONE, RULE) if n % 2 == 0 else (RULE, NONE):
                phases.append({"round": n, "side": side, **(_rule_phase(ctx, dag) if side == RULE else _run_phase(ctx, dag, side))})
        workloads.stop_stack(ctx)
        alarms, notable = processes.scan_logs()
        select_floor = floors.select_one()
    _print(args, phases, load_before, python_floor, select_floor, notable)
    ok = all(p["incidents"] == 1 and p["deliveries"] == 1 and p["events"] == args.tasks for p in phases if p["side"] == RULE)
    print("  one incident and one notification for each storm: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


def _failing_dag(dag_id: str, tasks: int) -> Any:
    from orchestrator.models import Dag

    dag = make_dag(dag_id, {f"t{i:04d}": [] for i in range(tasks)}, python_callable=FAIL)
    Dag.objects.filter(pk=dag.pk).update(default_args={"retries": 0, "poison_threshold": 0})
    dag.refresh_from_db()
    return dag


def _run_phase(ctx: Any, dag: Any, name: str) -> dict[str, Any]:
    from bench import workloads

    load = os.getloadavg()[0]
    result, extra = workloads.run_once(ctx, f"alert-fanout-{name}", dag)
    busy = result.series["busy"].values
    attempts = sum(result.failed_attempts.values())
    return {"load": round(load, 2), "wall": result.wall, "failed_attempts": attempts, "attempts_per_s": attempts / result.wall,
            "busy_median_ms": statistics.median(busy) * 1000 if busy else float("nan"), "cpu": extra["cpu"]}


def _rule_phase(ctx: Any, dag: Any) -> dict[str, Any]:
    from alerts import rules_cache
    from alerts.models import AlertEvent, AlertRule, Delivery, Incident

    rule = AlertRule.objects.create(name="every-failure", when="task_failed", notify="notifier:log", group_by=["category", "reason"])
    time.sleep(rules_cache.REFRESH + 0.5)  # every process's rules read again
    try:
        figures = _run_phase(ctx, dag, RULE)
        ended = time.monotonic()
        deadline = ended + 60
        while AlertEvent.objects.exists() or not Delivery.objects.filter(incident__rule=rule, state=Delivery.State.SENT).exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the sender did not count the events and send the notification within 60 s")
            time.sleep(0.05)
        figures["counted_after_s"] = time.monotonic() - ended
        incidents = Incident.objects.filter(rule=rule)
        figures["incidents"] = incidents.count()
        figures["events"] = sum(incidents.values_list("count", flat=True))
        figures["deliveries"] = Delivery.objects.filter(incident__rule=rule).count()
        return figures
    finally:
        rule.delete()
        time.sleep(rules_cache.REFRESH + 0.5)  # every process sees no rule again


def _print(args: argparse.Namespace, phases: list[dict[str, Any]], load_before: tuple[float, ...], python_floor: dict[str, Any],
           select_floor: float, notable: list[str]) -> None:
    print(f"\nload average before {[round(x, 2) for x in load_before]}, after {[round(x, 2) for x in os.getloadavg()]}")
    print(f"a fan-out of {args.tasks} python tasks failing once each (KeyError, one cause), {args.workers} workers; "
          f"{args.rounds} rounds, the phases alternating")
    print(f"  {'round':<6} {'phase':<9} {'load 1m':>7} {'wall s':>7} {'failures/s':>11} {'busy/job ms':>12} {'CPU ours s':>11} "
          f"{'counted after s':>16} {'incidents':>10} {'notifications':>14}")
    for p in phases:
        extra = (f"{p['counted_after_s']:16.2f} {p['incidents']:10d} {p['deliveries']:14d}" if p["side"] == RULE else "")
        print(f"  {p['round']:<6} {p['side']:<9} {p['load']:7.2f} {p['wall']:7.2f} {p['attempts_per_s']:11.1f} "
              f"{p['busy_median_ms']:12.1f} {p['cpu']['ours_cpu_s']:11.2f} {extra}")
    for side in (NONE, RULE):
        mine = [p for p in phases if p["side"] == side]
        print(f"  {side:<9} median of the rounds: wall {statistics.median(p['wall'] for p in mine):.2f} s, "
              f"{statistics.median(p['attempts_per_s'] for p in mine):.1f} failures/s, "
              f"busy/job {statistics.median(p['busy_median_ms'] for p in mine):.1f} ms")
    none = statistics.median(p["wall"] for p in phases if p["side"] == NONE)
    rule = statistics.median(p["wall"] for p in phases if p["side"] == RULE)
    print(f"  ratio rule / no rules (median wall): {rule / none:.2f}x")
    print(f"  floors: python -c pass {python_floor['mean_ms']:.1f} ms mean; SELECT 1 round trip {select_floor * 1000:.3f} ms median")
    others = [line for line in notable if "KeyError" not in line and "customer_id" not in line]
    print(f"  error lines in the processes' logs: {len(notable)}, {len(others)} of them not the tasks' own KeyError")
    for line in others[:5]:
        print(f"    {line}")


if __name__ == "__main__":
    sys.exit(main())
