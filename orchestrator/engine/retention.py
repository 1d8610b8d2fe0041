"""Deleting old history: finished runs past a cut-off, with everything that hangs from them.

`clean()` is what `manage.py db_clean` and the scheduler's scheduled clean-up call. It deletes
runs that ended (success or failed) before the cut-off, with their task instances, attempts
(their output and results), deadlines, and takes their failed attempts out of the hourly
failure counts in the same transactions, so the failures page keeps agreeing with the
attempts it lists. A run still running (a dead-lettered task keeps its run running) is never
touched, so the dead letters stay whole. Audit entries name their run by text and are kept.
The output store's files of the deleted attempts are deleted once their rows' deletion commits
(a crash in between leaves files no row names, never a row whose file is gone too early).

It works in small transactions: each deletes at most `batch` task instances (with their
attempts and deadlines) and is timed (`next_batch`). Half of `lock_budget` is the target: a
transaction that took longer shrinks the next batch at once to what would have fit (under load
one slow transaction is enough to react, not several halvings), and one that took under a tenth
of the target doubles it. So no transaction holds its locks (on SQLite, the write lock) for
much more than the target, and the engine goes on meanwhile. A run's row goes last, once its
task instances are gone.

With `duty` under 1 the clean also paces itself: after each transaction it pauses in
proportion to the time that transaction took (`pause_after`), so that it keeps busy at most
that share of the time (of a core, with its database backend) and leaves the rest to the
scheduler and the workers. `manage.py db_clean` paces (`--max-duty`,
ORCHESTRATOR_RETENTION_DUTY); the scheduler's own clean-up step, a few transactions inside a
pass, does not.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Model, Q, QuerySet

from deadlines.models import Deadline
from orchestrator import sql
from orchestrator.engine.failure_counts import uncount_task_instances
from orchestrator.models import BackfillDate, DagRun, TaskAttempt, TaskInstance
from orchestrator.outputstore import OutputStore, output_store
from retries.states import RunState

log = logging.getLogger(__name__)

FINISHED_RUN_STATES = (RunState.SUCCESS, RunState.FAILED)
RUNS_PER_ROUND = 100
MIN_BATCH, MAX_BATCH = 50, 5000


@dataclass
class CleanReport:
    runs: int = 0
    task_instances: int = 0
    attempts: int = 0
    deadlines: int = 0
    transactions: int = 0
    longest_transaction: float = 0.0
    paused: float = 0.0  # seconds spent pausing (the duty cycle)


def cutoffs(now: datetime, older_than_days: float, keep_failed_days: float | None) -> tuple[datetime, datetime]:
    """The end dates before which a successful and a failed run are deleted."""
    cutoff = now - timedelta(days=older_than_days)
    failed_cutoff = cutoff if keep_failed_days is None else min(cutoff, now - timedelta(days=keep_failed_days))
    return cutoff, failed_cutoff


def old_runs(cutoff: datetime, failed_cutoff: datetime) -> QuerySet[DagRun]:
    """Finished runs past their cut-off, oldest first."""
    return DagRun.objects.filter(
        Q(state=RunState.SUCCESS, end_date__lt=cutoff) | Q(state=RunState.FAILED, end_date__lt=failed_cutoff)
    ).order_by("end_date", "id")


def count(cutoff: datetime, failed_cutoff: datetime) -> CleanReport:
    """What `clean()` would delete now (for --dry-run)."""
    runs = old_runs(cutoff, failed_cutoff)
    tis = TaskInstance.objects.filter(dag_run__in=runs.values("pk"))
    return CleanReport(
        runs=runs.count(),
        task_instances=tis.count(),
        attempts=TaskAttempt.objects.filter(task_instance__in=tis.values("pk")).count(),
        deadlines=Deadline.objects.filter(dag_run__in=runs.values("pk")).count(),
    )


def clean(
    cutoff: datetime,
    failed_cutoff: datetime,
    *,
    lock_budget: float = 1.0,
    batch: int = 500,
    max_transactions: int | None = None,
    duty: float = 1.0,
    pause: Callable[[float], None] = time.sleep,
    progress: Callable[[CleanReport], None] | None = None,
) -> CleanReport:
    """Delete the finished runs past their cut-off in small timed transactions (see the module).
    `max_transactions` stops early (the scheduler's step does a few per pass); the rest is
    deleted by the next call. `duty` (0 < duty <= 1) is the share of the time spent working:
    under 1, each transaction is followed by `pause(seconds)`."""
    if not 0 < duty <= 1:
        raise ValueError(f"duty must be greater than 0 and at most 1, got {duty!r}")
    report = CleanReport()
    while max_transactions is None or report.transactions < max_transactions:
        started = time.monotonic()
        run_ids = list(old_runs(cutoff, failed_cutoff).values_list("pk", flat=True)[:RUNS_PER_ROUND])
        if not run_ids:
            break
        began = time.monotonic()
        with transaction.atomic():
            done = _delete_batch(run_ids, cutoff, failed_cutoff, batch, report)
        elapsed = time.monotonic() - began
        report.transactions += 1
        report.longest_transaction = max(report.longest_transaction, elapsed)
        batch = next_batch(batch, elapsed, lock_budget)
        if progress is not None:
            progress(report)
        if not done:
            break
        rest = pause_after(time.monotonic() - started, duty)
        if rest > 0:
            pause(rest)
            report.paused += rest
    return report


def next_batch(batch: int, elapsed: float, lock_budget: float) -> int:
    """The next transaction's batch after one of `batch` task instances took `elapsed` seconds:
    over the target (half the lock budget), at once what would have fit; well under it, twice
    as many."""
    target = lock_budget / 2
    if elapsed > target:
        return max(MIN_BATCH, min(batch - 1, int(batch * target / elapsed)))
    if elapsed < target / 10:
        return min(MAX_BATCH, batch * 2)
    return batch


def pause_after(worked: float, duty: float) -> float:
    """The pause after `worked` seconds that keeps the share of time working at `duty`."""
    return worked * (1 - duty) / duty


def _delete_batch(run_ids: list[int], cutoff: datetime, failed_cutoff: datetime, batch: int, report: CleanReport) -> bool:
    """One transaction: up to `batch` task instances of these runs with what hangs from them, or
    (when they have none left) the runs themselves. Returns False when nothing was left to do."""
    # Lock the runs (PostgreSQL) and check again that they are still finished and old: an
    # operator may have cleared one since it was picked, and then it is not history any more.
    runs = old_runs(cutoff, failed_cutoff).filter(pk__in=run_ids)
    run_ids = list(runs.select_for_update().values_list("pk", flat=True))
    if not run_ids:
        return True
    ti_ids = list(TaskInstance.objects.filter(dag_run_id__in=run_ids).order_by().values_list("pk", flat=True)[:batch])
    if ti_ids:
        uncount_task_instances(ti_ids)
        _delete_output_on_commit(ti_ids)
        report.attempts += _delete(TaskAttempt, "task_instance_id", ti_ids)
        report.deadlines += _delete(Deadline, "task_instance_id", ti_ids)
        report.task_instances += _delete(TaskInstance, "id", ti_ids)
        return True
    report.deadlines += _delete(Deadline, "dag_run_id", run_ids)
    # A backfill keeps its record of each date; the run it made is gone (as the model's SET_NULL).
    BackfillDate.objects.filter(dag_run_id__in=run_ids).update(dag_run=None)
    report.runs += _delete(DagRun, "id", run_ids)
    return True


def _delete_output_on_commit(ti_ids: list[int]) -> None:
    store = output_store()
    if not store.enabled:
        return
    attempts = list(TaskAttempt.objects.filter(task_instance_id__in=ti_ids).order_by().values_list("task_instance_id", "attempt_token"))
    transaction.on_commit(lambda: _delete_output(store, attempts))


def _delete_output(store: OutputStore, attempts: list[tuple[int, int]]) -> None:
    try:
        store.delete(attempts)
    except OSError as exc:  # the rows are gone either way: their files are left, not the clean-up
        log.warning("could not delete the stored output of %s attempts: %s", len(attempts), exc)


def _delete(model: type[Model], column: str, ids: list[int]) -> int:
    """One DELETE by a list of ids: what hangs from these rows is deleted before them, so the
    ORM's collection of cascades (a read of every row first) is not needed."""
    return sql.execute(f"DELETE FROM {model._meta.db_table} WHERE {column} IN ({sql.placeholders(len(ids))})", ids)
