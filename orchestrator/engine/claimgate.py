"""The gate a worker passes when it claims a job: a circuit that opened, or a queue paused by
an infrastructure storm, after the task was dispatched holds it there too.

Dispatch checks circuits and paused queues, but a fan-out queues all its ready tasks at once,
before any of them has failed: without this gate every one of them would call the downstream
that is failing and spend a user try, and the circuit could only stop the next run. So the
worker asks again when it claims the job: a held task goes back to `scheduled` with
`waiting_for` naming its circuit (or queue), its attempt row removed and its try kept for the
next dispatch (`retry_is_platform`): nothing is charged for the wait. The circuit's close
releases it like any task it held.
"""
from __future__ import annotations

from datetime import datetime

from django.db import transaction

from orchestrator.engine import circuits, storms
from orchestrator.engine.transitions import transition
from orchestrator.models import TaskAttempt
from retries.admission import Hold
from retries.circuits import current_state
from retries.states import CircuitState, TaskState, WaitKind


def hold_at_claim(task_instance_id: int, token: int, queue: str, circuit: str | None, now: datetime) -> Hold | None:
    """What holds this freshly claimed attempt, or None when it may run: its queue is paused,
    or its circuit is open, or half-open with a probe out that is not this attempt."""
    if queue in storms.paused_queues(now):
        return Hold(WaitKind.QUEUE, queue)
    if not circuit:
        return None
    row = circuits.get(circuit)
    state = current_state(CircuitState(row.state), row.opened_at, now, circuits.settings_for(row).cooldown)
    if state is CircuitState.CLOSED:
        return None
    if state is CircuitState.HALF_OPEN and (row.probe_task_instance_id, row.probe_token) == (task_instance_id, token):
        return None  # this attempt is the probe
    return Hold(WaitKind.CIRCUIT, circuit)


def put_back(task_instance_id: int, token: int, hold: Hold, now: datetime) -> bool:
    """Undo the dispatch of a claimed attempt that must wait: fenced by its token and `queued`."""
    waiting_for = {"kind": str(hold.kind), "name": hold.name, "since": now.isoformat()}
    with transaction.atomic():
        moved = transition(
            task_instance_id,
            expected=[TaskState.QUEUED],
            token=token,
            state=TaskState.SCHEDULED,
            # The dispatch already counted this try: the next one repeats it, charging nothing.
            retry_is_platform=True,
            waiting_for=waiting_for,
            heartbeat_at=None,
            hostname="",
            worker_name="",
            pid=None,
        )
        if moved:
            TaskAttempt.objects.filter(task_instance_id=task_instance_id, attempt_token=token, state=TaskAttempt.State.QUEUED).delete()
    return moved
