"""Early-warning estimates (deadlines.risk): pure rules."""
from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from deadlines.risk import critical_path_seconds, task_remaining, typical_duration

NOW = datetime(2026, 11, 20, 6, 0, tzinfo=UTC)


def test_it_takes_the_longest_chain_through_unfinished_tasks():
    """a -> (b, c) -> d: the estimate is a + max(b, c) + d, not the sum of all four."""
    remaining = {"a": 10, "b": 30, "c": 5, "d": 2}
    upstream = {"b": ["a"], "c": ["a"], "d": ["b", "c"]}
    assert critical_path_seconds(remaining, upstream) == 42


def test_it_ignores_upstream_tasks_that_are_already_done():
    """A finished upstream (absent from `remaining`) adds nothing."""
    assert critical_path_seconds({"d": 2, "c": 5}, {"d": ["b", "c"], "c": ["a"]}) == 7


def test_it_survives_a_cycle():
    """A cycle (never valid, but never fatal) does not recurse forever."""
    assert critical_path_seconds({"a": 1, "b": 2}, {"a": ["b"], "b": ["a"]}) == 3


def test_it_counts_what_is_left_of_a_running_task():
    """Running 15 s into a typical 20 s: 5 s left; past its typical duration: 0, never negative."""
    assert task_remaining("running", 20, NOW, started_at=NOW - timedelta(seconds=15)) == 5
    assert task_remaining("running", 20, NOW, started_at=NOW - timedelta(seconds=50)) == 0


def test_it_adds_the_wait_of_a_task_up_for_retry_and_calls_a_dead_letter_endless():
    """up_for_retry waits for its retry first; a dead-lettered task needs an operator: infinite."""
    assert task_remaining("up_for_retry", 20, NOW, next_retry_at=NOW + timedelta(seconds=8)) == 28
    assert task_remaining("queued", 20, NOW) == 20
    assert math.isinf(task_remaining("dead_letter", 20, NOW))


def test_it_needs_enough_samples_for_a_typical_duration():
    """The median, only with at least `min_samples` durations."""
    assert typical_duration([10, 11, 90], 3) == 11
    assert typical_duration([10, 11], 3) is None


@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(min_value=0, max_value=1e6), min_size=1))
def test_it_is_at_least_the_longest_task_and_at_most_the_sum(remaining):
    """Whatever the links, the critical path lies between the longest task and the total."""
    names = sorted(remaining)
    upstream = {n: names[:i] for i, n in enumerate(names)}
    for links in (upstream, {}):
        value = critical_path_seconds(remaining, links)
        assert max(remaining.values()) <= value <= sum(remaining.values()) * (1 + 1e-9) + 1e-9
