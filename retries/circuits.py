"""Circuit breakers: when a downstream is down, hold its tasks instead of burning retries. Pure.

A circuit groups the tasks that call one downstream. It opens when, among the attempts of
its tasks that ended within the window (and after its last close), there are at least
`min_attempts` and the share that failed with an application or timeout failure is at least
`failure_rate`. While open nothing of it is dispatched. After `cooldown` it is half-open and
one task goes through as a probe: success closes it and releases the held tasks spread over
`ramp` seconds; failure opens it again. The engine applies these rules with its clock.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from retries.states import CircuitState


@dataclass(frozen=True)
class CircuitSettings:
    """A circuit's tunables: its own, else the ORCHESTRATOR_CIRCUIT_* settings
    (`orchestrator.engine.circuits.settings_for`)."""

    window: float
    min_attempts: int
    failure_rate: float
    cooldown: float
    ramp: float


def counting_since(now: datetime, window: float, closed_at: datetime | None) -> datetime:
    """Attempts that ended at or after this time count: the window, but never before the last close."""
    start = now - timedelta(seconds=window)
    return max(start, closed_at) if closed_at is not None else start


def should_open(attempts: int, failures: int, settings: CircuitSettings) -> bool:
    return attempts > 0 and attempts >= settings.min_attempts and failures / attempts >= settings.failure_rate


def current_state(state: CircuitState, opened_at: datetime | None, now: datetime, cooldown: float) -> CircuitState:
    """An open circuit whose cool-down has passed is half-open."""
    if state is CircuitState.OPEN and (opened_at is None or now >= opened_at + timedelta(seconds=cooldown)):
        return CircuitState.HALF_OPEN
    return state


def after_probe(succeeded: bool) -> CircuitState:
    return CircuitState.CLOSED if succeeded else CircuitState.OPEN


class Gate(StrEnum):
    """What the circuit says about dispatching one of its tasks now."""

    PASS = "pass"
    HOLD = "hold"
    PROBE = "probe"  # pass, as the half-open circuit's one probe (if this caller wins it)


def gate(state: CircuitState, *, probe_in_flight: bool, release_at: datetime | None, now: datetime) -> Gate:
    """`state` is the current one (see `current_state`); `release_at` is the task's slot in a ramp."""
    if state is CircuitState.OPEN:
        return Gate.HOLD
    if state is CircuitState.HALF_OPEN:
        return Gate.HOLD if probe_in_flight else Gate.PROBE
    if release_at is not None and release_at > now:
        return Gate.HOLD  # closed, but this task's turn in the ramp has not come
    return Gate.PASS


def ramp_schedule(count: int, now: datetime, ramp: float) -> list[datetime]:
    """Release times for `count` held tasks (best-ranked first): uniformly over `ramp` seconds.

    The i-th task goes at now + i * ramp / count, so the downstream sees a steady trickle
    instead of every held task in the same second.
    """
    if count <= 0:
        return []
    step = ramp / count
    return [now + timedelta(seconds=i * step) for i in range(count)]


def peak_per_second(times: Sequence[datetime]) -> int:
    """The most release times that fall in any one-second bucket (a check of a schedule's spread)."""
    buckets: dict[int, int] = {}
    for t in times:
        second = int(t.timestamp())
        buckets[second] = buckets.get(second, 0) + 1
    return max(buckets.values(), default=0)
