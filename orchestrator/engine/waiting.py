"""Whether a run has reached an end a waiting client should report (trigger_dag --wait)."""
from __future__ import annotations

from orchestrator.engine.rules import Readiness, readiness
from orchestrator.models import DagRun
from retries.states import RunState, TaskState

ACTIVE = frozenset({TaskState.SCHEDULED, TaskState.QUEUED, TaskState.RUNNING, TaskState.UP_FOR_RETRY})


def blocked_on_dead_letter(run: DagRun) -> bool:
    """True when nothing can move until an operator acts on a dead-lettered task."""
    instances = list(run.task_instances.select_related("definition"))
    states = {ti.task_id: ti.state for ti in instances}
    if TaskState.DEAD_LETTER not in states.values():
        return False
    for ti in instances:
        if ti.state in ACTIVE:
            return False
        if ti.state == TaskState.NONE and ti.definition is not None:
            upstream = [states.get(u, TaskState.REMOVED) for u in ti.definition.upstream]
            if readiness(ti.definition.trigger_rule, upstream) is not Readiness.WAIT:
                return False  # the next pass will move it
    return True


def wait_outcome(run: DagRun) -> str | None:
    """`success`, `failed`, `dead_letter`, or None while the run can still move on its own."""
    if run.state in (RunState.SUCCESS, RunState.FAILED):
        return run.state
    if run.state == RunState.RUNNING and blocked_on_dead_letter(run):
        return "dead_letter"
    return None
