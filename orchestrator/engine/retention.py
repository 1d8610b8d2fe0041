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

What hangs from a run is found from the models' foreign keys (`_delete_rows`), not listed here:
a row that refers to a run or a task instance (attempts, task state entries, deadlines, and
whatever is added later) is deleted before it, or let go of when its key is SET_NULL (a
backfill's date keeps its record). A run that still cannot be deleted (a row the application
does not know of refers to it) must not stop the clean-up for good: a transaction that fails is
tried again run by run, and a run that fails alone is skipped, with one warning, for as long as
the caller keeps its `skipped` set (db_clean: its own run; the scheduler: its life), so the runs
behind it are deleted all the same.

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from django.db import DatabaseError, InterfaceError, OperationalError, models, transaction
from django.db.models import Model, Q, QuerySet

from deadlines.models import Deadline
from orchestrator.data import sql
from orchestrator.engine.failure_counts import uncount_task_instances
from orchestrator.foundation.outputstore import OutputStore, output_store
from orchestrator.foundation.sanitise import error_text
from orchestrator.models import DagRun, TaskAttempt, TaskInstance
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
    skipped: int = 0  # runs that could not be deleted (each named once in a warning)

    def add(self, part: CleanReport) -> None:
        """Count what one committed transaction deleted."""
        self.runs += part.runs
        self.task_instances += part.task_instances
        self.attempts += part.attempts
        self.deadlines += part.deadlines


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
    skipped: set[int] | None = None,
) -> CleanReport:
    """Delete the finished runs past their cut-off in small timed transactions (see the module).
    `max_transactions` stops early (the scheduler's step does a few per pass); the rest is
    deleted by the next call. `duty` (0 < duty <= 1) is the share of the time spent working:
    under 1, each transaction is followed by `pause(seconds)`. `skipped`: the runs found
    undeletable before, left alone; the ones found now are added to it."""
    if not 0 < duty <= 1:
        raise ValueError(f"duty must be greater than 0 and at most 1, got {duty!r}")
    cleaning = _Cleaner(cutoff, failed_cutoff, lock_budget, batch, max_transactions, duty, pause, progress, skipped)
    while cleaning.more():
        started = time.monotonic()
        run_ids = list(old_runs(cutoff, failed_cutoff).exclude(pk__in=sorted(cleaning.skipped)).values_list("pk", flat=True)[:RUNS_PER_ROUND])
        if not run_ids:
            break
        if cleaning.step(run_ids, started) is None:
            # Something in this batch cannot be deleted: each run alone, so that only it stays.
            for run_id in run_ids:
                cleaning.delete_alone(run_id)
    return cleaning.report


class _Cleaner:
    """One call of `clean()`: its report, its batch size and its pacing."""

    def __init__(
        self,
        cutoff: datetime,
        failed_cutoff: datetime,
        lock_budget: float,
        batch: int,
        max_transactions: int | None,
        duty: float,
        pause: Callable[[float], None],
        progress: Callable[[CleanReport], None] | None,
        skipped: set[int] | None,
    ) -> None:
        self.cutoffs = (cutoff, failed_cutoff)
        self.lock_budget, self.batch, self.max_transactions = lock_budget, batch, max_transactions
        self.duty, self.pause, self.progress = duty, pause, progress
        self.skipped = set() if skipped is None else skipped
        self.report = CleanReport()
        self.error: DatabaseError | None = None  # why the last transaction that failed did

    def more(self) -> bool:
        return self.max_transactions is None or self.report.transactions < self.max_transactions

    def step(self, run_ids: list[int], started: float | None = None) -> bool | None:
        """One transaction on these runs: whether they are all gone now, or None when it failed
        (rolled back, nothing deleted). `started`: when the work it paces began (its query)."""
        began = time.monotonic()
        started = began if started is None else started
        part = CleanReport()
        try:
            with transaction.atomic():
                gone = _delete_batch(run_ids, *self.cutoffs, self.batch, part)
        except (OperationalError, InterfaceError):
            raise  # the database is away or busy: the next call tries again
        except DatabaseError as exc:
            self.error = exc
            gone = None
        elapsed = time.monotonic() - began
        if gone is not None:
            self.report.add(part)
        self.report.transactions += 1
        self.report.longest_transaction = max(self.report.longest_transaction, elapsed)
        self.batch = next_batch(self.batch, elapsed, self.lock_budget)
        if self.progress is not None:
            self.progress(self.report)
        rest = pause_after(time.monotonic() - started, self.duty)
        if rest > 0:
            self.pause(rest)
            self.report.paused += rest
        return gone

    def delete_alone(self, run_id: int) -> None:
        """Delete one run in transactions of its own; skip it, saying why once, if it fails."""
        while self.more():
            gone = self.step([run_id])
            if gone:
                return
            if gone is None:
                self.skipped.add(run_id)
                self.report.skipped += 1
                log.warning(
                    "retention: run %s cannot be deleted; it is skipped and the runs behind it are deleted: %s",
                    _named(run_id), error_text(self.error) if self.error else "",
                )
                return


def _named(run_id: int) -> str:
    found = DagRun.objects.filter(pk=run_id).values_list("dag__dag_id", "run_id").first()
    return f"{run_id} ({found[0]}/{found[1]})" if found else str(run_id)


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
    (when they have none left) the runs themselves. Returns whether the runs are gone (or no
    longer to be deleted)."""
    # Lock the runs (PostgreSQL) and check again that they are still finished and old: an
    # operator may have cleared one since it was picked, and then it is not history any more.
    runs = old_runs(cutoff, failed_cutoff).filter(pk__in=run_ids)
    run_ids = list(runs.select_for_update().values_list("pk", flat=True))
    if not run_ids:
        return True
    ti_ids = list(TaskInstance.objects.filter(dag_run_id__in=run_ids).order_by().values_list("pk", flat=True)[:batch])
    deleted: Counter[type[Model]] = Counter()
    if ti_ids:
        uncount_task_instances(ti_ids)
        _delete_output_on_commit(ti_ids)
        _delete_rows(TaskInstance, ti_ids, deleted)
    else:
        _delete_rows(DagRun, run_ids, deleted)
    report.task_instances += deleted[TaskInstance]
    report.attempts += deleted[TaskAttempt]
    report.deadlines += deleted[Deadline]
    report.runs += deleted[DagRun]
    return not ti_ids


def _delete_rows(model: type[Model], ids: list[int], deleted: Counter[type[Model]]) -> None:
    """Delete these rows of `model`, and first every row that hangs from them, as the models'
    foreign keys say: CASCADE deletes it (and what hangs from it), SET_NULL lets go of it (a
    backfill's date keeps its record when its run goes). Any other rule (PROTECT) is the
    database's to enforce: the run is then skipped. A run's task instances are deleted by
    themselves, in batches, before it."""
    for rel in model._meta.related_objects:
        if not (rel.one_to_many or rel.one_to_one) or (model is DagRun and rel.related_model is TaskInstance):
            continue
        child, column = cast(type[Model], rel.related_model), rel.field.column
        if rel.on_delete is models.SET_NULL:
            sql.execute(f"UPDATE {child._meta.db_table} SET {column} = NULL WHERE {column} IN ({sql.placeholders(len(ids))})", ids)
        elif rel.on_delete is models.CASCADE:
            if any(r.one_to_many or r.one_to_one for r in child._meta.related_objects):
                child_ids = list(child._base_manager.filter(**{f"{rel.field.attname}__in": ids}).order_by().values_list("pk", flat=True))
                if child_ids:
                    _delete_rows(child, child_ids, deleted)
            else:
                deleted[child] += _delete(child, column, ids)
    deleted[model] += _delete(model, "id", ids)


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
