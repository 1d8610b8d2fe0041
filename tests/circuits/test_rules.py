"""Circuit breaker rules (retries.circuits), as functions of their inputs and a clock."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.engine.circuits import settings_for
from orchestrator.models import Circuit
from retries.circuits import (
    Gate,
    after_probe,
    counting_since,
    current_state,
    gate,
    peak_per_second,
    ramp_schedule,
    should_open,
)
from retries.states import CircuitState

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
FAST = settings(deadline=None, max_examples=200)
DEFAULTS = settings_for(Circuit(name="defaults"))  # the settings: window 60, min attempts 20, failure rate 0.5, cool-down 30, ramp 30


@FAST
@given(st.integers(0, 200), st.integers(0, 200))
def test_it_opens_only_with_enough_attempts_and_a_high_enough_failure_share(attempts, failures):
    failures = min(failures, attempts)
    expected = attempts >= 20 and failures * 2 >= attempts
    assert should_open(attempts, failures, DEFAULTS) is expected


def test_the_boundaries():
    assert not should_open(19, 19, DEFAULTS)
    assert should_open(20, 10, DEFAULTS)
    assert not should_open(20, 9, DEFAULTS)
    assert not should_open(0, 0, replace(DEFAULTS, min_attempts=0))


def test_the_window_starts_afresh_at_a_close():
    assert counting_since(NOW, 60, None) == NOW - timedelta(seconds=60)
    closed = NOW - timedelta(seconds=10)
    assert counting_since(NOW, 60, closed) == closed
    assert counting_since(NOW, 60, NOW - timedelta(hours=1)) == NOW - timedelta(seconds=60)


@FAST
@given(st.floats(0, 120), st.floats(1, 60))
def test_an_open_circuit_is_half_open_after_its_cool_down(elapsed, cooldown):
    opened = NOW - timedelta(seconds=elapsed)
    state = current_state(CircuitState.OPEN, opened, NOW, cooldown)
    assert state is (CircuitState.HALF_OPEN if elapsed >= cooldown else CircuitState.OPEN)
    assert current_state(CircuitState.CLOSED, opened, NOW, cooldown) is CircuitState.CLOSED


def test_gate_holds_while_open_lets_one_probe_and_follows_the_ramp():
    assert gate(CircuitState.OPEN, probe_in_flight=False, release_at=None, now=NOW) is Gate.HOLD
    assert gate(CircuitState.HALF_OPEN, probe_in_flight=False, release_at=None, now=NOW) is Gate.PROBE
    assert gate(CircuitState.HALF_OPEN, probe_in_flight=True, release_at=None, now=NOW) is Gate.HOLD
    later = NOW + timedelta(seconds=1)
    assert gate(CircuitState.CLOSED, probe_in_flight=False, release_at=later, now=NOW) is Gate.HOLD
    assert gate(CircuitState.CLOSED, probe_in_flight=False, release_at=NOW, now=NOW) is Gate.PASS
    assert after_probe(True) is CircuitState.CLOSED
    assert after_probe(False) is CircuitState.OPEN


@FAST
@given(st.integers(0, 5000), st.floats(0.5, 600))
def test_the_ramp_spreads_releases_uniformly(count, ramp):
    times = ramp_schedule(count, NOW, ramp)
    assert len(times) == count
    assert times == sorted(times)
    if count:
        assert times[0] == NOW
        assert times[-1] < NOW + timedelta(seconds=ramp)
        # Uniform: no second gets more than its share (rounded up, plus one at a bucket edge).
        assert peak_per_second(times) <= int(count / ramp) + 2
