"""A failure storm through the worker's report path, without alert rules and with a rule that
matches every failure: what the rule adds to a failure report, what the sender's count of the
storm costs, and how many notifications the storm queues.

    .venv/bin/python -m bench.alert_storm --backend postgres [--failures 200] [--rounds 3] [--warmup 20]

Each phase is a new run of a DAG of `--failures` tasks; every task is claimed and marked
running first (as a worker does, not timed), then each reports one failed attempt from the same
cause (`task_exception`, the same error and fingerprint) through
`orchestrator.engine.reporting.report_failure`, back to back, each report timed to its return
(the alert matching runs inside it: a matching rule queues the event, one INSERT in the report's
transaction). Phase "no rules": the alert rules table is empty. Phase "rule": one rule,
`when: task_failed`, no filters (it matches every failure), `group_by: [category, reason]`,
`notify: notifier:log`, created before the phase and deleted after it. The two phases alternate
for `--rounds` rounds (no rules first in even rounds, the rule first in odd ones), so load from
elsewhere on the machine and drift (growing tables, warmer caches) reach both alike.

Then, apart from the reports around it, the alerts app's recorder itself (`alerts.events.task_failed`,
what a report calls inside its transaction: the cached rules, the match, the event's INSERT),
timed 300 times inside a transaction each, with the rule and without: what the rule adds to a
report, free of the report's own spread.

After each rule phase, the sender's step `alerts.incidents.absorb` (what the scheduler's sender
threads run every half second) counts the queued events in their incident, timed; the counts
are of incidents and of queued notifications (Delivery rows), what the sender would send.

Uses a throwaway PostgreSQL database (on DATABASE_URL's server, default 127.0.0.1:5432) and a
claimed Redis database (REDIS_URL's server, default 127.0.0.1:6379), both removed at the end.
Prints the floor of the same run: the median round trip of `SELECT 1`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

from bench import floors
from bench.stack import handle_stop_signals
from bench.throwaway import migrated_django

ERROR = "KeyError: 'customer_id'"
FINGERPRINT = "aaaaaaaaaaaa"
NONE, RULE = "no rules", "rule"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.alert_storm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres",), default="postgres", help="the database (only postgres)")
    parser.add_argument("--failures", type=int, default=200, help="failed attempts per phase (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two phases, alternating (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="threads reporting at once, each with its own connection, as workers would (default 1)")
    parser.add_argument("--show-queries", action="store_true", help="print the SQL of one failure report with the rule")
    parser.add_argument("--warmup", type=int, default=20, help="untimed failures before the phases (default 20)")
    args = parser.parse_args(argv)
    if args.failures < 1 or args.warmup < 0 or args.threads < 1 or args.rounds < 1:
        parser.error("--failures, --rounds and --threads must be at least 1, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    load_before = os.getloadavg()
    with migrated_django("alert_storm_bench"):
        from alerts import rules_cache
        from alerts.models import AlertRule

        if args.warmup:
            storm(_dag("warmup", args.warmup), args.threads)
        rules_cache.invalidate()
        assert not AlertRule.objects.exists()
        results: dict[str, list[float]] = {NONE: [], RULE: []}
        rounds: list[dict[str, Any]] = []
        for n in range(args.rounds):
            one: dict[str, Any] = {"load": round(os.getloadavg()[0], 2)}
            for side in (NONE, RULE) if n % 2 == 0 else (RULE, NONE):
                if side == NONE:
                    times, wall = storm(_dag(f"storm_none_{n}", args.failures), args.threads)
                else:
                    times, wall, one["sender"] = _rule_phase(_dag(f"storm_rule_{n}", args.failures), args)
                results[side] += times
                one[side] = (statistics.median(times), wall)
            rounds.append(one)
        queries = {RULE: _with_rule(lambda: _queries_per_report(_dag("queries_rule", 10), show=args.show_queries))[0],
                   NONE: _queries_per_report(_dag("queries_none", 10))}
        recorder = {RULE: _with_rule(lambda: _recorder_ms(_dag("recorder_rule", 1)))[0], NONE: _recorder_ms(_dag("recorder_none", 1))}
        floor = floors.select_one()
    print(f"load average before {[round(x, 2) for x in load_before]}, after {[round(x, 2) for x in os.getloadavg()]}")
    print(f"{args.failures} failed attempts from one cause per phase, reported back to back by {args.threads} thread(s); "
          f"{args.rounds} rounds, the phases alternating (after {args.warmup} untimed)")
    print(f"  {'round':<6} {'load 1m':>7} {'no rules: median ms':>20} {'wall s':>7} {'rule: median ms':>16} {'wall s':>7} "
          f"{'sender: events':>15} {'ms':>7} {'queries':>8} {'incidents':>10} {'notifications':>14}")
    ok = True
    for n, one in enumerate(rounds):
        sender = one["sender"]
        ok = ok and sender["incidents"] == 1 and sender["deliveries"] == 1 and sender["events"] == args.failures
        print(f"  {n:<6} {one['load']:7.2f} {one[NONE][0] * 1000:20.2f} {one[NONE][1]:7.3f} {one[RULE][0] * 1000:16.2f} {one[RULE][1]:7.3f} "
              f"{sender['events']:15d} {sender['seconds'] * 1000:7.1f} {sender['queries']:8d} {sender['incidents']:10d} {sender['deliveries']:14d}")
    print(f"  {'all reports':<16} {'median ms':>10} {'p95 ms':>8} {'mean ms':>8} {'max ms':>8} {'queries/report':>15}")
    for side in (NONE, RULE):
        ms = sorted(t * 1000 for t in results[side])
        print(f"  {side:<16} {statistics.median(ms):10.2f} {_p95(ms):8.2f} {statistics.fmean(ms):8.2f} {ms[-1]:8.2f} {queries[side]:>15}")
    none, rule_ = sorted(results[NONE]), sorted(results[RULE])
    print(f"  ratio rule / no rules: median {statistics.median(rule_) / statistics.median(none):.2f}x, "
          f"p95 {_p95(rule_) / _p95(none):.2f}x, mean {statistics.fmean(rule_) / statistics.fmean(none):.2f}x")
    print(f"  the recorder alone (alerts.events.task_failed in a transaction, median of 300): rule {recorder[RULE]:.3f} ms, "
          f"no rules {recorder[NONE]:.3f} ms")
    print(f"  floor: SELECT 1 round trip {floor * 1000:.3f} ms median")
    print("  one incident and one notification for each storm: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


def _with_rule(phase: Any) -> tuple[Any, int]:
    """Run `phase()` with the rule matching every failure in place; its result and the rule's id
    (the rule is deleted after, its incidents and notifications with it)."""
    from alerts import rules_cache
    from alerts.models import AlertRule

    rule = AlertRule.objects.create(name="every-failure", when="task_failed", notify="notifier:log", group_by=["category", "reason"])
    rules_cache.invalidate()
    try:
        return phase(), rule.pk
    finally:
        rule.delete()
        rules_cache.invalidate()


def _recorder_ms(dag: Any) -> float:
    """The median time of the alerts app's recorder of a failed attempt, inside a transaction
    (whose first statement has run, as in a report)."""
    from django.db import connection, transaction

    from alerts import events
    from orchestrator.engine import run_creation
    from orchestrator.models import TaskInstance
    from retries.context import ExecutionContext
    from retries.states import Reason, Source

    run = run_creation.create_manual_run(dag)
    ti = TaskInstance.objects.select_related("dag_run__dag").filter(dag_run=run).first()
    context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER)
    events.task_failed(ti, context, fingerprint=FINGERPRINT, error=ERROR)  # the rules read
    times = []
    for _ in range(300):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            began = time.perf_counter()
            events.task_failed(ti, context, fingerprint=FINGERPRINT, error=ERROR)
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def _rule_phase(dag: Any, args: argparse.Namespace) -> tuple[list[float], float, dict[str, Any]]:
    """The storm with the rule, then the sender's count of its events (timed, its queries counted)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from alerts import incidents

    def phase() -> tuple[list[float], float, dict[str, Any]]:
        times, wall = storm(dag, args.threads)
        with CaptureQueriesContext(connection) as captured:
            began = time.perf_counter()
            taken = total = incidents.absorb()
            while taken:
                taken = incidents.absorb()
                total += taken
            seconds = time.perf_counter() - began
        from alerts.models import AlertRule

        counts = _counts(AlertRule.objects.get(name="every-failure").pk)
        return times, wall, {"taken": total, "seconds": seconds, "queries": len(captured.captured_queries), **counts}

    result, _ = _with_rule(phase)
    return result


def _dag(dag_id: str, tasks: int) -> Any:
    from orchestrator.models import Dag, Task

    # Retries left and a long retry delay: each task's failure is an attempt that will be retried
    # later, and the run stays running (no run-level work joins the reports).
    dag = Dag.objects.create(dag_id=dag_id, default_args={"retries": 3, "retry_delay": 3600, "poison_threshold": 0})
    Task.objects.bulk_create(
        [Task(dag=dag, task_id=f"t{i:04d}", bash_command="true", upstream=[], position=i) for i in range(tasks)], batch_size=2000
    )
    return dag


def storm(dag: Any, threads: int = 1) -> tuple[list[float], float]:
    """A new run of the DAG, every task claimed and running; then one failure report each, timed."""
    from django.db import connections

    from orchestrator.engine import reporting, run_advance, run_creation
    from orchestrator.models import TaskInstance
    from retries.context import ExecutionContext
    from retries.states import Reason, Source, TaskState

    worker = reporting.WorkerInfo(hostname="bench", worker_name="bench-alert-storm", pid=os.getpid())
    run = run_creation.create_manual_run(dag)
    total = TaskInstance.objects.filter(dag_run=run).count()
    running: list[tuple[int, int]] = []
    for _ in range(100):
        run_advance.advance_run(run.pk)
        for pk, token in TaskInstance.objects.filter(dag_run=run, state=TaskState.QUEUED).values_list("pk", "attempt_token"):
            assert reporting.claim(pk, token, worker)
            assert reporting.mark_running(pk, token, pid=os.getpid(), has_start_deadlines=False)
            running.append((pk, token))
        if len(running) == total:
            break
    assert len(running) == total, f"{len(running)} of {total} tasks running"
    context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER)
    times: list[float] = []
    failed: list[int] = []

    def report(share: list[tuple[int, int]], own_connection: bool) -> None:
        try:
            for pk, token in share:
                began = time.perf_counter()
                decision = reporting.report_failure(pk, token, context, error=ERROR, fingerprint=FINGERPRINT)
                times.append(time.perf_counter() - began)
                if decision is None:
                    failed.append(pk)
        finally:
            if own_connection:
                connections.close_all()  # this thread's

    started = time.perf_counter()
    if threads == 1:
        report(running, own_connection=False)
    else:
        pool = [threading.Thread(target=report, args=(running[i::threads], True)) for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    wall = time.perf_counter() - started
    assert not failed, f"{len(failed)} stale reports, {len(times)} timed of {total}"
    assert len(times) == total, f"{len(failed)} stale reports, {len(times)} timed of {total}"
    left = TaskInstance.objects.filter(dag_run=run, state=TaskState.RUNNING).count()
    assert left == 0, f"{left} task instances still running"
    return times, wall


def _queries_per_report(dag: Any, *, show: bool = False) -> float:
    """Queries per failure report (a short storm, not timed: counting them slows them)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from orchestrator.engine import reporting

    real = reporting.report_failure
    counted: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        with CaptureQueriesContext(connection) as captured:
            result = real(*args, **kwargs)
        counted.append(len(captured.captured_queries))
        if show and len(counted) == 5:
            for query in captured.captured_queries:
                print(f"    {query['sql'][:160]}")
        return result

    reporting.report_failure = counting  # type: ignore[assignment]
    try:
        storm(dag)
    finally:
        reporting.report_failure = real  # type: ignore[assignment]
    return statistics.median(counted)


def _counts(rule_id: int) -> dict[str, Any]:
    from django.db.models import Count, Sum

    from alerts.models import Delivery, Incident

    incidents = Incident.objects.filter(rule_id=rule_id)
    deliveries = Delivery.objects.filter(incident__rule_id=rule_id)
    return {
        "incidents": incidents.count(),
        "events": incidents.aggregate(n=Sum("count"))["n"] or 0,
        "deliveries": deliveries.count(),
        "by_event": dict(deliveries.values_list("event").annotate(n=Count("id")).order_by("event")),
    }


def _p95(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(0.95 * (len(sorted_values) - 1)))]


if __name__ == "__main__":
    sys.exit(main())
