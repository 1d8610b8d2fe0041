"""The rules of a run as a whole, each in one place: how many of a DAG's runs may be active
(`max_active_runs`), and what a paused DAG holds. Pure.

`max_active_runs` caps a DAG's RUNNING runs; a backfill's runs are not counted (a backfill has
a limit of its own, `engine.backfill_runs`). Two paths ask about it, and both read it from
`free_run_slots`, as Airflow does:

- a queued run starts while a slot is free (`may_start_run`, `run_advance`): the other queued
  runs do not count, they are not ordered and each waits for a slot as this one does;
- the scheduler creates a DAG's next scheduled run only when a slot is free for it after the
  runs already queued took theirs (`may_create_scheduled_run`, `scheduler.create_due_run`):
  running + queued under the cap. A DAG at its cap does not pile up queued runs (a catchup DAG
  would queue every missed date at once), and a run the scheduler creates starts at once.

Manual runs and backfills are created whatever the cap: a manual run waits queued for its slot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Q

if TYPE_CHECKING:
    from orchestrator.models import DagRun


@dataclass(frozen=True)
class ActiveRuns:
    """A DAG's runs that hold or wait for a slot of `max_active_runs` (a backfill's left out)."""

    running: int
    queued: int


def free_run_slots(max_active_runs: int, active: ActiveRuns) -> int:
    """How many more of the DAG's runs may be running now."""
    return max(0, max_active_runs - active.running)


def may_start_run(max_active_runs: int, active: ActiveRuns) -> bool:
    """Whether a queued run of the DAG may start now."""
    return free_run_slots(max_active_runs, active) > 0


def may_create_scheduled_run(max_active_runs: int, active: ActiveRuns) -> bool:
    """Whether the scheduler may create the DAG's next scheduled run: a slot is left for it once
    the queued runs took theirs."""
    return free_run_slots(max_active_runs, active) > active.queued


def held_by_pause(run: DagRun) -> bool:
    """A paused DAG's runs stand still (a queued one is not started); a backfill's runs go on
    while their DAG is paused."""
    return run.dag.paused and run.backfill_id is None


def not_held_by_pause(run: str = "") -> Q:
    """`held_by_pause` negated, as a filter on runs (or on what reaches a run through `run`,
    e.g. "dag_run__")."""
    return Q(**{f"{run}dag__paused": False}) | Q(**{f"{run}backfill__isnull": False})
