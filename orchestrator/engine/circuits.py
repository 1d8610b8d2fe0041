"""Circuit breakers applied: the rules of retries.circuits on the Circuit rows.

Every change of a circuit is a conditional update on the state it was read in, so two
schedulers (or a scheduler and a worker's report) evaluating the same circuit change it once.
The half-open probe is claimed the same way: exactly one task instance wins it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from orchestrator.engine.transitions import transition
from orchestrator.foundation.clock import shared_now
from orchestrator.listeners import notify
from orchestrator.models import Circuit, TaskAttempt, TaskInstance
from retries import admission
from retries.circuits import (
    CircuitSettings,
    after_probe,
    counting_since,
    current_state,
    ramp_schedule,
    should_open,
)
from retries.states import (
    ACTIVE_TASK_STATES,
    CIRCUIT_CLOSE_FROM,
    CIRCUIT_FAILURE_CATEGORIES,
    CIRCUIT_OPEN_FROM,
    CIRCUIT_PROBE_FROM,
    HOLD_FROM,
    CircuitState,
    RunState,
)

log = logging.getLogger(__name__)

ENDED = (TaskAttempt.State.SUCCESS, TaskAttempt.State.FAILED)


def settings_for(circuit: Circuit) -> CircuitSettings:
    """The circuit's own tunables, each falling back to its ORCHESTRATOR_CIRCUIT_* setting."""

    def pick(value: Any, name: str) -> Any:
        return value if value is not None else getattr(settings, f"ORCHESTRATOR_CIRCUIT_{name}")

    return CircuitSettings(
        window=float(pick(circuit.window, "WINDOW")),
        min_attempts=int(pick(circuit.min_attempts, "MIN_ATTEMPTS")),
        failure_rate=float(pick(circuit.failure_rate, "FAILURE_RATE")),
        cooldown=float(pick(circuit.cooldown, "COOLDOWN")),
        ramp=float(pick(circuit.ramp, "RAMP")),
    )


def get(name: str) -> Circuit:
    circuit, _ = Circuit.objects.get_or_create(name=name)
    return circuit


@dataclass(frozen=True)
class WindowCount:
    attempts: int
    failures: int


def window_count(circuit: Circuit, now: datetime) -> WindowCount:
    """Attempts of the circuit's tasks that ended in its window (and after its last close)."""
    since = counting_since(now, settings_for(circuit).window, circuit.closed_at)
    ended = TaskAttempt.objects.filter(task_instance__circuit=circuit.name, state__in=ENDED, end_date__gte=since)
    failures = ended.filter(state=TaskAttempt.State.FAILED, context__category__in=[str(c) for c in CIRCUIT_FAILURE_CATEGORIES])
    return WindowCount(ended.count(), failures.count())


# --- moving a circuit ---------------------------------------------------------------------------


def _move(circuit: Circuit, expected: frozenset[CircuitState] | set[CircuitState], **changes: Any) -> bool:
    """Change the circuit if it is still in one of `expected` (and in the state it was read in)."""
    rows = Circuit.objects.filter(pk=circuit.pk, state__in=[str(s) for s in expected])
    rows = rows.filter(state=circuit.state)
    changes.setdefault("updated_at", timezone.now())
    won = rows.update(**changes) == 1
    if won:
        circuit.refresh_from_db()
    return won


def open_circuit(circuit: Circuit, now: datetime, *, reason: str) -> bool:
    """Open it (an open one starts its cool-down afresh); listeners hear only a change of state."""
    was_open = circuit.state == CircuitState.OPEN
    with transaction.atomic():
        won = _move(
            circuit, CIRCUIT_OPEN_FROM, state=CircuitState.OPEN, opened_at=now, probe_task_instance_id=None, probe_token=None
        )
        if won and not was_open:
            log.warning("circuit %s opened: %s", circuit.name, reason)
            transaction.on_commit(lambda: notify("on_circuit_opened", circuit=circuit))
    return won


def close_circuit(circuit: Circuit, now: datetime, *, reason: str) -> bool:
    """Close it and spread the tasks it held over its ramp, best-ranked first."""
    with transaction.atomic():
        won = _move(
            circuit, CIRCUIT_CLOSE_FROM, state=CircuitState.CLOSED, closed_at=now, probe_task_instance_id=None, probe_token=None
        )
        if not won:
            return False
        released = schedule_release(circuit.name, now, settings_for(circuit).ramp)
        log.warning("circuit %s closed: %s; %d held tasks released over %ss", circuit.name, reason, released, settings_for(circuit).ramp)
        transaction.on_commit(lambda: notify("on_circuit_closed", circuit=circuit))
    return True


def half_open(circuit: Circuit) -> bool:
    """Let one probe through (after the cool-down, or when an operator asks)."""
    return _move(circuit, CIRCUIT_PROBE_FROM, state=CircuitState.HALF_OPEN, probe_task_instance_id=None, probe_token=None)


def claim_probe(name: str, task_instance_id: int, token: int) -> bool:
    """The half-open circuit's one probe: True for exactly one caller."""
    return (
        Circuit.objects.filter(name=name, state=CircuitState.HALF_OPEN, probe_task_instance_id__isnull=True).update(
            probe_task_instance_id=task_instance_id, probe_token=token, updated_at=timezone.now()
        )
        == 1
    )


def held_tasks(name: str, now: datetime) -> list[TaskInstance]:
    """Ready tasks of the circuit in running runs: those a close releases."""
    return list(
        TaskInstance.objects.select_related("dag_run")
        .filter(circuit=name, state__in=HOLD_FROM, dag_run__state=RunState.RUNNING)
        .filter(Q(next_retry_at__isnull=True) | Q(next_retry_at__lte=now))
    )


def schedule_release(name: str, now: datetime, ramp: float) -> int:
    """Give each held task its turn in the ramp: now + i * ramp / n, best-ranked first."""
    tasks = held_tasks(name, now)
    order = admission.ranked(
        admission.Candidate(ti.pk, "", ti.task_id, ti.dag_run.queued_at, ti.priority_weight) for ti in tasks
    )
    by_key = {ti.pk: ti for ti in tasks}
    times = ramp_schedule(len(order), now, ramp)
    for candidate, release_at in zip(order, times):
        ti = by_key[candidate.key]
        transition(ti.pk, expected=[ti.state], token=ti.attempt_token, release_at=release_at)
    return len(order)


# --- evaluation ---------------------------------------------------------------------------------


def evaluate(name: str, now: datetime | None = None) -> CircuitState:
    """Apply the rules to one circuit now; return its state afterwards."""
    now = now or shared_now()
    circuit = get(name)
    rules = settings_for(circuit)
    state = CircuitState(circuit.state)
    if state is CircuitState.OPEN and current_state(state, circuit.opened_at, now, rules.cooldown) is CircuitState.HALF_OPEN:
        half_open(circuit)
    elif state is CircuitState.HALF_OPEN and circuit.probe_task_instance_id is not None:
        _judge_probe(circuit, now)
    elif state is CircuitState.CLOSED:
        count = window_count(circuit, now)
        if should_open(count.attempts, count.failures, rules):
            open_circuit(circuit, now, reason=f"{count.failures} of {count.attempts} attempts failed in {rules.window:g}s")
    return CircuitState(circuit.state)


def _judge_probe(circuit: Circuit, now: datetime) -> None:
    """The probe's attempt ended: success closes, a downstream failure opens again.

    A probe that never reached the downstream (a platform failure, an operator's clear) is
    no verdict: the probe is given up and another task goes.
    """
    token = circuit.probe_token  # set with probe_task_instance_id
    attempt = (
        None
        if token is None
        else TaskAttempt.objects.filter(task_instance_id=circuit.probe_task_instance_id, attempt_token=token).first()
    )
    if attempt is None:  # the probe is claimed and dispatched in one transaction: the task is gone
        _give_up_probe(circuit)
        return
    if attempt.state not in ENDED:
        ti = TaskInstance.objects.filter(pk=attempt.task_instance_id).only("state", "attempt_token").first()
        if ti is None or ti.attempt_token != attempt.attempt_token or ti.state not in ACTIVE_TASK_STATES:
            _give_up_probe(circuit)
        return
    category = (attempt.context or {}).get("category")
    succeeded = attempt.state == TaskAttempt.State.SUCCESS
    if not succeeded and category not in {str(c) for c in CIRCUIT_FAILURE_CATEGORIES}:
        _give_up_probe(circuit)
    elif after_probe(succeeded) is CircuitState.CLOSED:
        close_circuit(circuit, now, reason="the probe succeeded")
    else:
        open_circuit(circuit, now, reason="the probe failed")


def _give_up_probe(circuit: Circuit) -> None:
    Circuit.objects.filter(
        pk=circuit.pk, state=CircuitState.HALF_OPEN, probe_task_instance_id=circuit.probe_task_instance_id
    ).update(probe_task_instance_id=None, probe_token=None, updated_at=timezone.now())


def attempt_ended(circuit: str | None) -> None:
    """After a report: evaluate the task's circuit, if it has one. Never raises into the reporter."""
    if not circuit:
        return
    try:
        evaluate(circuit)
    except Exception:
        log.exception("could not evaluate circuit %s; the scheduler will", circuit)


def evaluate_all(now: datetime) -> None:
    """The scheduler's pass: every circuit (cool-downs end by time, not by reports)."""
    for name in Circuit.objects.values_list("name", flat=True):
        try:
            evaluate(name, now)
        except Exception:
            log.exception("could not evaluate circuit %s", name)


# --- what dispatch asks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """A circuit as dispatch sees it: its current state and whether a probe is out."""

    state: CircuitState
    probe_in_flight: bool


def read(names: set[str], now: datetime) -> dict[str, Reading]:
    """The current state of each named circuit (created if new); an ended cool-down reads half-open."""
    rows = {c.name: c for c in Circuit.objects.filter(name__in=names)}
    for name in names - rows.keys():
        rows[name] = get(name)
    readings = {}
    for name, c in rows.items():
        state = current_state(CircuitState(c.state), c.opened_at, now, settings_for(c).cooldown)
        if state is CircuitState.HALF_OPEN and c.state == CircuitState.OPEN:
            half_open(c)
        probe_out = state is CircuitState.HALF_OPEN and c.state == CircuitState.HALF_OPEN and c.probe_task_instance_id is not None
        readings[name] = Reading(state, probe_out)
    return readings
