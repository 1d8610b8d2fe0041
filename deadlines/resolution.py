"""Settling a deadline as met or missed: each one a conditional update, so it happens once.

Whoever wins the update (the periodic check, or the engine finishing a run or task late)
queues the callback, counts the metric and tells the listeners, all after commit.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import DurationField, ExpressionWrapper, F, FloatField, Value
from django.db.models.functions import Extract

from deadlines import queueing
from deadlines.conf import setting
from deadlines.models import OPEN_STATES, Deadline
from orchestrator.data import metrics
from orchestrator.listeners import notify

log = logging.getLogger(__name__)


def seconds_late(need_by: datetime, at: datetime) -> float:
    """Positive when `at` is after `need_by`; negative (early) before it."""
    return round((at - need_by).total_seconds(), 3)


class ClaimConflict(Exception):
    """A batch claim found rows already settled by someone else: the batch is rolled back."""


def _miss_changes(now: datetime) -> dict[str, object]:
    """A miss also queues dispatch 1 of the callback: the row says `queued` before the job
    exists, and the lease tells the check when to look for a job that never arrived."""
    lease = timedelta(seconds=float(setting("ORCHESTRATOR_DEADLINE_CALLBACK_QUEUE_LEASE")))
    return {
        "state": Deadline.State.MISSED,
        "resolved_at": now,
        "callback_state": Deadline.CallbackState.QUEUED,
        "callback_attempts": 1,
        "callback_next_at": now + lease,
        "callback_error": "",
    }


def mark_missed(deadline: Deadline, now: datetime) -> bool:
    """Claim the miss of an open deadline; True only for the one caller that wins."""
    changes = {**_miss_changes(now), "lateness_seconds": seconds_late(deadline.need_by, now)}
    won = Deadline.objects.filter(pk=deadline.pk, state__in=OPEN_STATES).update(**changes) == 1
    if won:
        for name, value in changes.items():
            setattr(deadline, name, value)
    return won


def mark_missed_batch(deadlines: list[Deadline], now: datetime) -> list[Deadline]:
    """Claim the misses of open deadlines read in the current transaction, in one statement.

    The update is conditional like the single one; it must win every row or none. The check
    reads the batch with row locks (PostgreSQL) or inside SQLite's write lock, so nobody else
    can settle them first; should anyone have, ClaimConflict rolls the batch back and the
    next pass reads again, so no miss is ever claimed twice.
    """
    if not deadlines:
        return []
    changes = _miss_changes(now)
    native = connection.features.has_native_duration_field
    lateness = {"lateness_seconds": _seconds_since_need_by(now)} if native else {}
    won = Deadline.objects.filter(pk__in=[d.pk for d in deadlines], state__in=OPEN_STATES).update(**changes, **lateness)
    if won != len(deadlines):
        raise ClaimConflict(f"claimed {won} of {len(deadlines)} due deadlines; another process settled the rest")
    for deadline in deadlines:
        for name, value in changes.items():
            setattr(deadline, name, value)
        deadline.lateness_seconds = seconds_late(deadline.need_by, now)
    if not native:
        Deadline.objects.bulk_update(deadlines, ["lateness_seconds"])
    return deadlines


def _seconds_since_need_by(now: datetime) -> Extract:
    """`now - need_by` in seconds, computed by the database (one statement for the whole batch)."""
    elapsed = ExpressionWrapper(Value(now) - F("need_by"), output_field=DurationField())
    return Extract(elapsed, "epoch", output_field=FloatField())


def mark_met(deadline: Deadline, finished_at: datetime) -> bool:
    changes = {
        "state": Deadline.State.MET,
        "resolved_at": finished_at,
        "lateness_seconds": seconds_late(deadline.need_by, finished_at),
    }
    won = Deadline.objects.filter(pk=deadline.pk, state__in=OPEN_STATES).update(**changes) == 1
    if won:
        for name, value in changes.items():
            setattr(deadline, name, value)
    return won


def after_misses(missed: list[Deadline]) -> None:
    """Once the claims commit: queue the callbacks, count the misses, call the listeners."""
    if not missed:
        return
    jobs = [queueing.job_for(d, queueing.MISSED, d.callback_attempts) for d in missed]

    def side_effects() -> None:
        queueing.enqueue(jobs)
        for dag_id, count in Counter(d.dag_run.dag.dag_id for d in missed).items():
            metrics.increment(metrics.DEADLINE_MISSES, amount=count, dag_id=dag_id)
        for d in missed:
            log.warning(
                "deadline missed: dag %s run %s%s, %s need-by %s, %.1fs late",
                d.dag_run.dag.dag_id, d.dag_run.run_id, f" task {d.task_id}" if d.task_id else "",
                d.reference, d.need_by.isoformat(), d.lateness_seconds or 0.0,
            )
            notify("on_deadline_missed", deadline=d)

    transaction.on_commit(side_effects)


def settle_finished(rows: Iterable[Deadline], finished_at: datetime, *, final_lateness: bool = True) -> list[Deadline]:
    """The run or task these deadlines watch finished at `finished_at`.

    Open ones are met when it finished by need-by, else missed now (the check had not got
    there yet: the callback still runs, once). With `final_lateness`, an already missed one
    records by how much it was finally late, for the history. Returns the newly missed.
    """
    missed: list[Deadline] = []
    for deadline in rows:
        if deadline.state in OPEN_STATES:
            if finished_at <= deadline.need_by:
                mark_met(deadline, finished_at)
            elif mark_missed(deadline, finished_at):
                missed.append(deadline)
        elif deadline.state == Deadline.State.MISSED and final_lateness:
            Deadline.objects.filter(pk=deadline.pk, state=Deadline.State.MISSED).update(
                lateness_seconds=seconds_late(deadline.need_by, finished_at)
            )
    after_misses(missed)
    return missed
