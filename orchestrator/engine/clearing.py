"""Clearing a task instance: back to `none` with fresh tries, fenced by the state and token read.

An operator's clear (`actions.clear`) and a backfill's re-run of a finished run
(`engine/backfills.py`) both clear through `clear_one()`, so a cleared task is the same
whoever cleared it.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator.audit import audit
from orchestrator.clock import shared_now
from orchestrator.engine.transitions import transition
from orchestrator.exceptions import Conflict
from orchestrator.models import DagRun, TaskInstance
from orchestrator.taskconfig import args_for
from retries.context import ExecutionContext
from retries.policy import cleared_max_tries
from retries.states import Reason, RunState, Source, TaskState


def changed_meanwhile(ti: TaskInstance) -> Conflict:
    return Conflict(f"task '{ti.label}' changed meanwhile (it was {ti.state}); reload and try again")


def clear_one(ti: TaskInstance, context: dict[str, Any]) -> None:
    """`ti` back to `none` with its tries renewed (`cleared_max_tries`) and `context` as its last
    failure context; `Conflict` when it changed since it was read."""
    retries = int(args_for(ti)["retries"])
    won = transition(
        ti.pk,
        expected=[ti.state],
        token=ti.attempt_token,
        state=TaskState.NONE,
        # A new token fences out a dispatch that read the task before this clear.
        attempt_token=ti.attempt_token + 1,
        max_tries=cleared_max_tries(ti.try_number, retries),
        next_retry_at=None,
        end_date=None,
        fingerprint_streak=0,
        retry_is_platform=False,
        pre_execution_tries=0,
        last_failure_context=context,
        result=None,  # it has not succeeded again yet
    )
    if not won:
        raise changed_meanwhile(ti)


def clear_for_rerun(run: DagRun, states: Iterable[str], *, by: str, note: str) -> list[dict[str, str]]:
    """Clear every task of `run` in one of `states` for a backfill's re-run, as an operator's
    clear would (fresh tries, context `user_action/manual_clear` naming `by`); one audit entry.

    The caller has taken the finished run (a conditional update) in the same transaction."""
    now = shared_now()
    touched = []
    instances = TaskInstance.objects.filter(dag_run=run, state__in=list(states), definition__isnull=False)
    for ti in instances.select_related("dag_run", "dag_run__dag", "definition").order_by("id"):
        context = {**ExecutionContext.of(Reason.MANUAL_CLEAR, Source.API, user=by, note=note, prior_state=str(ti.state)).to_dict(), "at": now.isoformat()}
        clear_one(ti, context)
        touched.append({"task_id": ti.task_id, "prior_state": ti.state, "new_state": TaskState.NONE.value})
    audit(None, "backfill_rerun", run.dag.dag_id, run.run_id, "", "", RunState.RUNNING, {"note": note, "cleared": touched}, username=by)
    return touched
