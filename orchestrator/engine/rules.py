"""Trigger rules: whether a task may run given its upstream tasks' states, and a run's outcome. Pure."""
from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from retries.states import (
    FAILED_TASK_STATES,
    FINISHED_TASK_STATES,
    RunState,
    TaskState,
    TriggerRule,
)


class Readiness(StrEnum):
    WAIT = "wait"
    RUN = "run"
    UPSTREAM_FAILED = "upstream_failed"
    SKIPPED = "skipped"


def readiness(rule: str, upstream_states: Iterable[str]) -> Readiness:
    """A dead-lettered upstream is not done: its downstream waits until an operator acts."""
    states = [TaskState(s) for s in upstream_states]
    if not states:
        return Readiness.RUN
    all_done = all(s in FINISHED_TASK_STATES for s in states)
    any_failed = any(s in FAILED_TASK_STATES for s in states)
    any_success = any(s is TaskState.SUCCESS for s in states)
    match TriggerRule(rule):
        case TriggerRule.ALL_SUCCESS:
            if any_failed:
                return Readiness.UPSTREAM_FAILED
            if not all_done:
                return Readiness.WAIT
            if all(s in (TaskState.SUCCESS, TaskState.REMOVED) for s in states):
                return Readiness.RUN
            return Readiness.SKIPPED
        case TriggerRule.ALL_DONE:
            return Readiness.RUN if all_done else Readiness.WAIT
        case TriggerRule.ONE_SUCCESS:
            if any_success:
                return Readiness.RUN
            return Readiness.UPSTREAM_FAILED if all_done else Readiness.WAIT
        case TriggerRule.ONE_FAILED:
            if any_failed:
                return Readiness.RUN
            return Readiness.SKIPPED if all_done else Readiness.WAIT
        case TriggerRule.NONE_FAILED:
            if any_failed:
                return Readiness.UPSTREAM_FAILED
            return Readiness.RUN if all_done else Readiness.WAIT
    raise ValueError(f"unknown trigger rule {rule!r}")


def taking_part(states: list[str]) -> list[str]:
    """One task's instances' states as trigger rules read them: a mapped task's instances that an
    expansion over a shorter list removed take no part (`removed` is dropped unless it is all
    there is: a task removed from its DAG)."""
    kept = [s for s in states if s != TaskState.REMOVED]
    return kept if kept else states


def run_outcome(task_states: Iterable[str]) -> RunState | None:
    """The run's final state once every task is done, else None (still running)."""
    states = [TaskState(s) for s in task_states]
    if not all(s in FINISHED_TASK_STATES for s in states):
        return None
    return RunState.FAILED if any(s in FAILED_TASK_STATES for s in states) else RunState.SUCCESS
