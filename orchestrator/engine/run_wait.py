"""Whether a run has reached an end a waiting client should report (trigger_dag --wait)."""
from __future__ import annotations

from orchestrator.engine.rules import Readiness, readiness
from orchestrator.models import DagRun
from retries.states import (
    FINISHED_RUN_STATES,
    IN_FLIGHT_TASK_STATES,
    RunState,
    TaskState,
)


def blocked_on_dead_letter(run: DagRun) -> bool:
    """True when nothing can move until an operator acts on a dead-lettered task."""
    instances = list(run.task_instances.select_related("definition"))
    states: dict[str, list[str]] = {}  # a mapped task has one state per instance
    for ti in instances:
        states.setdefault(ti.task_id, []).append(ti.state)
    if not any(ti.state == TaskState.DEAD_LETTER for ti in instances):
        return False
    for ti in instances:
        if ti.state in IN_FLIGHT_TASK_STATES:
            return False
        if ti.state == TaskState.NONE and ti.definition is not None:
            upstream = [state for u in ti.definition.upstream for state in states.get(u, [TaskState.REMOVED])]
            if readiness(ti.definition.trigger_rule, upstream) is not Readiness.WAIT:
                return False  # the next pass will move it
    return True


def wait_outcome(run: DagRun) -> str | None:
    """`success`, `failed`, `dead_letter`, or None while the run can still move on its own."""
    if run.state in FINISHED_RUN_STATES:
        return run.state
    if run.state == RunState.RUNNING and blocked_on_dead_letter(run):
        return TaskState.DEAD_LETTER.value
    return None
