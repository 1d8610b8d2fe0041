"""Clearing a task instance: back to `none` with fresh tries, fenced by the state and token read.

An operator's clear (`actions.clear`) and a backfill's re-run of a finished run
(`engine/backfill_runs.py`) both clear through `clear_many()`, so a cleared task is the same
whoever cleared it.

A mapped task whose source is cleared with it is made unexpanded again (`unexpand`): its
instance 0 becomes the placeholder (map_index -1, state none) and every other instance k is
parked at map_index -(k+1), `removed`, keeping its row and so its attempts. Parked rows are no
entries of the run: the run document lists their attempts under the placeholder, and the next
expansion (`mapping.expand_ready`) places each back at k, to run over the new item k or, past
the new list, to stay `removed`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from orchestrator.data.audit import audit
from orchestrator.data.taskconfig import args_for
from orchestrator.engine import task_state_store
from orchestrator.engine.transitions import transition_many
from orchestrator.exceptions import Conflict
from orchestrator.foundation.clock import shared_now
from orchestrator.models import DagRun, TaskInstance
from retries.context import ExecutionContext
from retries.policy import cleared_max_tries
from retries.states import Reason, RunState, Source, TaskState

# What a clear resets, besides the state, the tries and the token.
_CLEARED = {
    "next_retry_at": None,
    "end_date": None,
    "fingerprint_streak": 0,
    "retry_is_platform": False,
    "pre_execution_tries": 0,
    "result": None,  # it has not succeeded again yet
}


def changed_meanwhile(ti: TaskInstance) -> Conflict:
    return Conflict(f"task '{ti.label}' changed meanwhile (it was {ti.state}); reload and try again")


def clear_one(ti: TaskInstance, context: dict[str, Any]) -> None:
    """`ti` back to `none` with its tries renewed (`cleared_max_tries`) and `context` as its last
    failure context; `Conflict` when it changed since it was read."""
    clear_many([ti], lambda _: context)


def clear_many(
    instances: Sequence[TaskInstance], context_of: Callable[[TaskInstance], dict[str, Any]], **changes: Any
) -> None:
    """`clear_one` for many task instances at once: one fenced statement per task and context
    (a few, however many instances), plus `changes`. `Conflict` when any of them changed since
    it was read: call it in a transaction, which then keeps none of it."""
    groups: dict[tuple[int, str], tuple[dict[str, Any], list[TaskInstance]]] = {}
    retries_of: dict[int | None, int] = {}
    for ti in instances:
        if ti.definition_id not in retries_of:
            retries_of[ti.definition_id] = int(args_for(ti)["retries"])
        context = context_of(ti)
        key = (retries_of[ti.definition_id], json.dumps(context, sort_keys=True, default=str))
        groups.setdefault(key, (context, []))[1].append(ti)
    for (retries, _), (context, group) in groups.items():
        won = transition_many(
            [(ti.pk, ti.attempt_token, ti.state) for ti in group],
            # A new token fences out a dispatch that read the task before this clear.
            computed={"attempt_token": "attempt_token + 1", "max_tries": _cleared_max_tries_sql(retries)},
            state=TaskState.NONE,
            last_failure_context=context,
            **{**_CLEARED, **changes},
        )
        lost = [ti for ti in group if ti.pk not in won]
        if lost:
            raise changed_meanwhile(lost[0])


def _cleared_max_tries_sql(retries: int) -> str:
    """`cleared_max_tries` over the row's own try_number, in SQL (it adds a constant to it)."""
    return f"try_number + {int(cleared_max_tries(0, retries))}"


def source_of(ti: TaskInstance) -> str | None:
    """The upstream whose result a mapped task expands over; None for a list literal or a task
    that is not mapped."""
    expand = ti.definition.expand if ti.definition is not None else None
    if not expand:
        return None
    ((_, source),) = expand.items()
    prefix = "results."
    return source[len(prefix) :] if isinstance(source, str) and source.startswith(prefix) else None


def parked_index(map_index: int) -> int:
    """Where instance `map_index` (1 and up) waits while its task is unexpanded; its own inverse."""
    return -map_index - 1


def unexpand(rows: Sequence[TaskInstance], context: dict[str, Any]) -> list[TaskInstance]:
    """Make a mapped task unexpanded again (its source was cleared): `rows` are all its rows of
    the run, none of them held by a worker. Instance 0 (or the placeholder it has) is cleared
    into the placeholder, map_index -1 and no item; every other instance is parked, `removed`,
    at `parked_index` (rows parked before stay so). Returns the rows it changed; `Conflict` (in
    the caller's transaction) when one changed since it was read."""
    placeholder = next((ti for ti in rows if ti.map_index == -1), None) or next((ti for ti in rows if ti.map_index == 0), None)
    instances = [ti for ti in rows if ti.map_index >= 0 and ti is not placeholder]
    if instances:
        groups: dict[int, list[TaskInstance]] = {}
        for ti in instances:
            groups.setdefault(int(args_for(ti)["retries"]), []).append(ti)
        for retries, group in groups.items():
            won = transition_many(
                [(ti.pk, ti.attempt_token, ti.state) for ti in group],
                computed={
                    "attempt_token": "attempt_token + 1",
                    "max_tries": _cleared_max_tries_sql(retries),
                    "map_index": "-map_index - 1",  # parked_index
                },
                state=TaskState.REMOVED,
                last_failure_context=context,
                **_CLEARED,
            )
            lost = [ti for ti in group if ti.pk not in won]
            if lost:
                raise changed_meanwhile(lost[0])
    changed = list(instances)
    if placeholder is not None and (placeholder.map_index >= 0 or placeholder.state != TaskState.NONE):
        clear_many([placeholder], lambda _: context, map_index=-1, map_item=None)
        changed.append(placeholder)
    return changed


def clear_with_sources(
    to_clear: Sequence[TaskInstance], related: Iterable[TaskInstance], context_of: Callable[[TaskInstance], dict[str, Any]]
) -> list[TaskInstance]:
    """Clear `to_clear` (`clear_many`), except that a mapped task whose source task is among
    them is unexpanded instead (`unexpand`, over all its rows found in `to_clear` and `related`,
    the run's rows the caller read of the tasks it may touch). Returns the rows it changed."""
    cleared_tasks = {ti.task_id for ti in to_clear}
    rows_of: dict[str, dict[int, TaskInstance]] = {}
    for ti in [*to_clear, *related]:
        if source_of(ti) in cleared_tasks and ti.map_index >= -1:
            rows_of.setdefault(ti.task_id, {}).setdefault(ti.pk, ti)
    plain = [ti for ti in to_clear if ti.task_id not in rows_of]
    clear_many(plain, context_of)
    changed = list(plain)
    for by_pk in rows_of.values():
        rows = list(by_pk.values())
        changed += unexpand(rows, context_of(min(rows, key=lambda ti: ti.map_index)))
    return changed


def clearable(instances: Iterable[TaskInstance]) -> list[TaskInstance]:
    """Rows a clear of every task may take: not a parked instance, nor one removed by an
    expansion over a shorter list (it is no part of its task any more)."""
    return [ti for ti in instances if ti.map_index >= -1 and not (ti.map_index >= 0 and ti.state == TaskState.REMOVED)]


def clear_for_rerun(run: DagRun, states: Iterable[str], *, by: str, note: str) -> list[dict[str, str]]:
    """Clear every task of `run` in one of `states` for a backfill's re-run, as an operator's
    clear would (fresh tries, context `user_action/manual_clear` naming `by`, a mapped task
    whose source is cleared made unexpanded, the task state emptied so that a resumable task
    starts a new remote job rather than finding its old one); one `backfill_rerun` audit entry
    for the run, then a `clear` entry per task instance cleared, each as done by `by`.

    The caller has taken the finished run (a conditional update) in the same transaction."""
    now = shared_now()
    rows = list(TaskInstance.objects.filter(dag_run=run).select_related("dag_run", "dag_run__dag", "definition").order_by("id"))
    states = {str(state) for state in states}
    instances = [ti for ti in clearable(rows) if ti.state in states and ti.definition_id is not None]

    def context_of(ti: TaskInstance) -> dict[str, Any]:
        return {**ExecutionContext.of(Reason.MANUAL_CLEAR, Source.API, user=by, note=note, prior_state=str(ti.state)).to_dict(), "at": now.isoformat()}

    changed = clear_with_sources(instances, rows, context_of)
    task_state_store.empty({ti.pk for ti in changed})
    touched = [{"task_id": ti.task_id, "prior_state": ti.state, "new_state": TaskState.NONE.value} for ti in instances]
    audit(None, "backfill_rerun", run.dag.dag_id, run.run_id, "", "", RunState.RUNNING, {"note": note, "cleared": touched}, username=by)
    details = {"note": note, "include_downstream": False, "keep_task_state": False}
    for ti in instances:
        instance = {**details, "map_index": ti.map_index} if ti.map_index >= 0 else details
        audit(None, "clear", run.dag.dag_id, run.run_id, ti.task_id, ti.state, TaskState.NONE, instance, username=by)
    return touched
