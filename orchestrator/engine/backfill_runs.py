"""Backfills in the engine: which dates a backfill acts on, and the scheduler step that starts its runs.

`plan()` says, for each logical date of the DAG's schedule in a range, whether the backfill
creates a run, re-runs the existing one, or skips the date. `start_runs(now)` is one step of the
scheduler's pass: for each running backfill it starts its next dates, oldest first (newest with
`backwards`), while fewer than the backfill's `max_active_runs` of its runs are queued or running.

Race-free with several schedulers: a backfill's row is locked for its step (on PostgreSQL with
SKIP LOCKED, so a second scheduler moves on to the next backfill; on SQLite writers queue), each
date is claimed with a conditional update from `pending`, and a re-run takes its run only by a
conditional update from a finished state, so a queued or running run is never touched.

A backfill's runs start here, directly in `running`: they never wait behind the DAG's own
`max_active_runs` (nor count against it), and they go on while the DAG is paused.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Count

from orchestrator.engine import clearing, schedules
from orchestrator.engine.run_advance import advance_run_now
from orchestrator.engine.run_creation import create_run
from orchestrator.foundation.run_params import fill_defaults
from orchestrator.models import Backfill, BackfillDate, Dag, DagRun
from retries.states import FINISHED_RUN_STATES, UNFINISHED_RUN_STATES, RunState, TaskState

log = logging.getLogger(__name__)

Action = BackfillDate.Action
Reprocess = Backfill.Reprocess

# What each reprocess behaviour clears in a run it re-runs.
CLEARED_STATES = {
    Reprocess.FAILED: frozenset({TaskState.FAILED, TaskState.UPSTREAM_FAILED, TaskState.DEAD_LETTER}),
    Reprocess.COMPLETED: frozenset(
        {
            TaskState.SUCCESS,
            TaskState.FAILED,
            TaskState.UPSTREAM_FAILED,
            TaskState.SKIPPED,
            TaskState.DEAD_LETTER,
            TaskState.UP_FOR_RETRY,
        }
    ),
}


# --- pure rules ----------------------------------------------------------------------------------


def action_for(run_states: Sequence[str], reprocess: str) -> Action:
    """What a backfill does at a date whose runs (oldest first) are in `run_states`."""
    if not run_states:
        return Action.CREATE
    if any(state in UNFINISHED_RUN_STATES for state in run_states):
        return Action.SKIP  # never a duplicate of, nor a change to, a queued or running run
    latest = run_states[-1]
    if reprocess == Reprocess.FAILED and latest == RunState.FAILED:
        return Action.RERUN
    if reprocess == Reprocess.COMPLETED and latest in FINISHED_RUN_STATES:
        return Action.RERUN
    return Action.SKIP


def start_order(backwards: bool) -> str:
    return "-logical_date" if backwards else "logical_date"


# --- planning --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedDate:
    logical_date: datetime
    action: Action
    run_id: int | None  # the run it re-runs or skips for


def plan(dag: Dag, dates: Iterable[datetime], reprocess: str, *, backwards: bool = False) -> list[PlannedDate]:
    """Each date's action given the DAG's runs now, in the order the backfill starts them."""
    dates = sorted(dates, reverse=backwards)
    if not dates:
        return []
    existing: dict[datetime, list[tuple[int, str]]] = {}
    rows = (
        DagRun.objects.filter(dag=dag, logical_date__gte=min(dates), logical_date__lte=max(dates))
        .order_by("id")
        .values_list("logical_date", "pk", "state")
    )
    for logical_date, pk, state in rows:
        existing.setdefault(logical_date, []).append((pk, state))
    planned = []
    for logical_date in dates:
        runs = existing.get(logical_date, [])
        action = action_for([state for _, state in runs], reprocess)
        planned.append(PlannedDate(logical_date, action, runs[-1][0] if runs else None))
    return planned


def logical_dates(dag: Dag, start: datetime, end: datetime, limit: int) -> list[datetime]:
    """The DAG's scheduled logical dates in [start, end] (at most limit + 1 of them)."""
    return schedules.ticks_between(dag.schedule or "", dag.timezone, start, end, limit)


# --- the scheduler step ----------------------------------------------------------------------------


def start_runs(now: datetime) -> int:
    """Start the next runs of every running backfill; end the backfills that are done.

    Returns how many runs it started."""
    started = 0
    for pk in Backfill.objects.filter(state=Backfill.State.RUNNING).order_by("created_at", "pk").values_list("pk", flat=True):
        try:
            started += start_batch(pk, now)
        except Exception:
            log.exception("could not start the runs of backfill %s; the next pass tries again", pk)
    return started


def start_batch(backfill_id: int, now: datetime) -> int:
    """Start as many of the backfill's pending dates as its limit allows, in one transaction."""
    run_ids: list[int] = []
    with transaction.atomic():
        backfill = _locked(backfill_id)
        if backfill is None or backfill.state != Backfill.State.RUNNING:
            return 0
        free = backfill.max_active_runs - active_runs(backfill.pk)
        if free > 0:
            pending = (
                BackfillDate.objects.filter(backfill=backfill, state=BackfillDate.State.PENDING)
                .order_by(start_order(backfill.backwards))[:free]
            )
            for date in pending:
                run_id = _start_date(backfill, date, now)
                if run_id is not None:
                    run_ids.append(run_id)
        if not run_ids:
            finish_if_done(backfill, now)
    for run_id in run_ids:
        advance_run_now(run_id)  # dispatch its first tasks now rather than at the next pass
    return len(run_ids)


def active_runs(backfill_id: int) -> int:
    """The backfill's runs queued or running now: what its max_active_runs limits."""
    return BackfillDate.objects.filter(
        backfill_id=backfill_id, state=BackfillDate.State.STARTED, dag_run__state__in=list(UNFINISHED_RUN_STATES)
    ).count()


def finish_if_done(backfill: Backfill, now: datetime) -> bool:
    """A running backfill with no date left to start and no run unfinished ends: success when
    every run it started succeeded, else failed."""
    dates = BackfillDate.objects.filter(backfill=backfill)
    if dates.filter(state=BackfillDate.State.PENDING).exists() or active_runs(backfill.pk):
        return False
    started = dates.filter(state=BackfillDate.State.STARTED)
    outcome = Backfill.State.FAILED if started.exclude(dag_run__state=RunState.SUCCESS).exists() else Backfill.State.SUCCESS
    return bool(Backfill.objects.filter(pk=backfill.pk, state=Backfill.State.RUNNING).update(state=outcome, end_date=now))


def _locked(backfill_id: int) -> Backfill | None:
    rows = Backfill.objects.select_related("dag").filter(pk=backfill_id)
    if connection.vendor == "postgresql":
        rows = rows.select_for_update(skip_locked=True, of=("self",))
    return rows.first()


def _start_date(backfill: Backfill, date: BackfillDate, now: datetime) -> int | None:
    """Start one date's run (a new one, or the existing one re-run); None when it was skipped or
    could not start now. Each date in its own savepoint: one that fails leaves the others."""
    try:
        with transaction.atomic():
            return _start_date_inner(backfill, date, now)
    except Exception:
        log.exception("backfill %s: could not start %s; trying again next pass", backfill.pk, date.logical_date.isoformat())
        return None


def _start_date_inner(backfill: Backfill, date: BackfillDate, now: datetime) -> int | None:
    runs = list(DagRun.objects.filter(dag_id=backfill.dag_id, logical_date=date.logical_date).order_by("id").values_list("pk", "state"))
    action = action_for([state for _, state in runs], backfill.reprocess)
    if action == Action.SKIP:
        _claim(date, BackfillDate.State.SKIPPED, runs[-1][0] if runs else None)
        return None
    if action == Action.CREATE:
        run = create_run(
            backfill.dag,
            run_type=DagRun.RunType.BACKFILL,
            logical_date=date.logical_date,
            # Checked when the backfill was made; a param the DAG declared since gets its default.
            conf=fill_defaults(backfill.dag.params, backfill.conf),
            now=now,
            triggered_by=backfill.created_by,
            backfill=backfill,
        )
        DagRun.objects.filter(pk=run.pk, state=RunState.QUEUED).update(state=RunState.RUNNING, start_date=now)
        if not _claim(date, BackfillDate.State.STARTED, run.pk):
            raise _Lost()
        return run.pk
    run_pk = runs[-1][0]
    # Taken only from a finished state: a run that became queued or running meanwhile stays as it is.
    if not DagRun.objects.filter(pk=run_pk, state__in=list(FINISHED_RUN_STATES)).update(
        state=RunState.RUNNING, start_date=now, end_date=None, backfill=backfill, run_type=DagRun.RunType.BACKFILL
    ):
        _claim(date, BackfillDate.State.SKIPPED, run_pk)
        return None
    run = DagRun.objects.select_related("dag").get(pk=run_pk)
    clearing.clear_for_rerun(
        run, CLEARED_STATES[Reprocess(backfill.reprocess)], by=backfill.created_by, note=f"backfill {backfill.pk} ({backfill.reprocess})"
    )
    if not _claim(date, BackfillDate.State.STARTED, run_pk):
        raise _Lost()
    return run_pk


class _Lost(Exception):
    """Another scheduler claimed the date first: roll this date's savepoint back."""


def _claim(date: BackfillDate, state: str, run_pk: int | None) -> bool:
    return bool(
        BackfillDate.objects.filter(pk=date.pk, state=BackfillDate.State.PENDING).update(state=state, dag_run_id=run_pk)
    )


# --- counts -----------------------------------------------------------------------------------------


def run_counts(backfill_id: int) -> dict[str, int]:
    """Its dates by where their runs are: total (dates it runs), pending (not started yet), and
    the started runs by state; plus the dates skipped and cancelled."""
    # One query, so that a date starting between two reads is not counted both pending and running.
    by_state: dict[str, int] = {}
    runs: dict[str, int] = {}
    rows = (
        BackfillDate.objects.filter(backfill_id=backfill_id)
        .values_list("state", "dag_run__state")
        .annotate(n=Count("pk"))
        .values_list("state", "dag_run__state", "n")
    )
    for state, run_state, n in rows:
        by_state[state] = by_state.get(state, 0) + n
        if state == BackfillDate.State.STARTED:
            runs[run_state] = runs.get(run_state, 0) + n
    pending = by_state.get(BackfillDate.State.PENDING, 0)
    started = by_state.get(BackfillDate.State.STARTED, 0)
    cancelled = by_state.get(BackfillDate.State.CANCELLED, 0)
    return {
        "total": pending + started + cancelled,
        "pending": pending,
        "queued": runs.get(RunState.QUEUED, 0),
        "running": runs.get(RunState.RUNNING, 0),
        "success": runs.get(RunState.SUCCESS, 0),
        "failed": runs.get(RunState.FAILED, 0),
        "skipped": by_state.get(BackfillDate.State.SKIPPED, 0),
        "cancelled": cancelled,
    }
