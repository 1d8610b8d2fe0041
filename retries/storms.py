"""The infrastructure storm rule: when a queue's workers keep dying, stop feeding it. Pure.

Many `worker_lost` or `pre_execution_failure` attempts in one queue within a short window mean
its worker pool is broken (a bad image, a node pool being drained, an OOM-killing neighbour):
every further dispatch there only spends another task's platform budget. So the queue is
paused, the way an open circuit holds its tasks, until its recent storm failures age out of the
window; tasks then flow again, and a pool that is still broken pauses it again at once.
"""
from __future__ import annotations

from collections.abc import Mapping

from retries.states import Reason

# Failures that count towards pausing a queue: the machines behind it, not the task, broke.
STORM_REASONS = frozenset({Reason.WORKER_LOST, Reason.PRE_EXECUTION_FAILURE})


def paused(storm_failures_in_window: Mapping[str, int], threshold: int) -> set[str]:
    """The queues with at least `threshold` storm failures in the window; 0 turns the rule off."""
    if threshold <= 0:
        return set()
    return {queue for queue, count in storm_failures_in_window.items() if count >= threshold}
