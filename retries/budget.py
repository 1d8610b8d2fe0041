"""Does a task's retry budget fit the deadline it must meet? Pure arithmetic, no database.

A task's worst case is every user try running to its `execution_timeout`, with the longest
wait the backoff can draw before each retry (jitter at its maximum). When that exceeds the
interval of a deadline that bounds the task, the deadline can be missed by a task that does
nothing worse than what its own settings allow.

The platform budget's worst case is shown beside it, not checked: infrastructure failures are
the platform's to prevent, and a deadline bounds the user's choice of retries and backoff.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from retries.backoff import ceiling

# Deadline references whose interval starts no later than the task's first try: a task-level
# reference (the task's own queue or start time) or the run's queue time.
BOUNDING_DAG_REFERENCES = frozenset({"dagrun_queued_at"})
BOUNDING_TASK_REFERENCES = frozenset({"task_queued_at", "task_started_at"})


def longest_waits(retries: int, retry_delay: float, backoff: str, max_delay: float) -> list[float]:
    """The longest wait before each retry 1..retries: the backoff's ceiling, which every jitter
    kind (full, equal, none) reaches at most."""
    return [ceiling(n, retry_delay, backoff, max_delay) for n in range(1, max(0, retries) + 1)]


def worst_case_seconds(retries: int, execution_timeout: float, retry_delay: float, backoff: str, max_delay: float) -> float:
    """(retries + 1) * execution_timeout plus the longest wait before each retry."""
    tries = max(0, retries) + 1
    return tries * float(execution_timeout) + sum(longest_waits(retries, retry_delay, backoff, max_delay))


def platform_worst_case_seconds(
    infrastructure_retry_limit: int, execution_timeout: float, infrastructure_retry_delay: float, detection_seconds: float
) -> float:
    """The most the platform budget can add: each platform retry may cost a try at its timeout,
    the time to notice the loss (the heartbeat timeout) and the platform retry delay."""
    return max(0, infrastructure_retry_limit) * (float(execution_timeout) + detection_seconds + infrastructure_retry_delay)


@dataclass(frozen=True)
class Verdict:
    """One task against one deadline that bounds it."""

    task_id: str
    deadline: str  # e.g. "task deadlines[0] (task_started_at + 300 s)"
    interval: float
    worst_case: float
    platform_worst_case: float

    @property
    def fits(self) -> bool:
        return self.worst_case <= self.interval


def seconds(value: float) -> str:
    """Seconds as written in messages: no ".0" on whole numbers."""
    return f"{int(value)}" if float(value).is_integer() else f"{value:g}"


def platform_retry_label(number: int, limit: int) -> str:
    """A retry of the platform's budget as every page numbers it: 'platform retry 1 of 5'."""
    return f"platform retry {number} of {limit}"


def bounding_deadlines(task_deadlines: Iterable[Mapping[str, Any]], dag_deadlines: Iterable[Mapping[str, Any]]) -> list[tuple[str, float]]:
    """(label, interval) of every deadline that bounds a task: its own, and the DAG's that start
    at the run's queue time."""
    found = []
    for scope, deadlines, allowed in (("task", task_deadlines, BOUNDING_TASK_REFERENCES), ("DAG", dag_deadlines, BOUNDING_DAG_REFERENCES)):
        for index, deadline in enumerate(deadlines):
            reference = str(deadline.get("reference"))
            if reference in allowed:
                interval = float(deadline.get("interval") or 0)
                found.append((f"{scope} deadlines[{index}] ({reference} + {seconds(interval)} s)", interval))
    return found


def check_task(
    task_id: str,
    args: Mapping[str, Any],
    task_deadlines: Iterable[Mapping[str, Any]],
    dag_deadlines: Iterable[Mapping[str, Any]],
    *,
    infrastructure_retry_delay: float,
    detection_seconds: float,
) -> list[Verdict]:
    """Every verdict for one task with its effective `args`; none without an execution_timeout
    (a task that may run forever has no worst case to compare)."""
    timeout = args.get("execution_timeout")
    if timeout is None:
        return []
    worst = worst_case_seconds(
        int(args["retries"]), float(timeout), float(args["retry_delay"]), str(args["retry_backoff"]), float(args["retry_max_delay"])
    )
    platform = platform_worst_case_seconds(int(args["infrastructure_retry_limit"]), float(timeout), infrastructure_retry_delay, detection_seconds)
    return [Verdict(task_id, label, interval, worst, platform) for label, interval in bounding_deadlines(task_deadlines, dag_deadlines)]


def remaining_worst_case_seconds(
    state: str,
    *,
    try_number: int,
    max_tries: int,
    execution_timeout: float,
    retry_delay: float,
    backoff: str,
    max_delay: float,
    running_for: float = 0.0,
    wait_left: float = 0.0,
) -> float:
    """The most a task can still take from now on its user budget: the rest of the current try
    (`running_for` seconds in, for a queued or running one) or the wait before the next
    (`wait_left`, for one up for retry), then every try left at its timeout with the longest
    wait before each. A deadline-risk estimate is never worse than this."""
    timeout = float(execution_timeout)
    if state in ("queued", "running"):
        total, next_try, waited = max(0.0, timeout - running_for), try_number + 1, False
    elif state == "up_for_retry":
        total, next_try, waited = max(0.0, wait_left), try_number + 1, True
    else:  # not started: its next try runs without a wait
        total, next_try, waited = 0.0, try_number + 1, True
    for n in range(next_try, max(max_tries, next_try - 1) + 1):
        if not waited:
            total += ceiling(n - 1, retry_delay, backoff, max_delay)
        waited = False
        total += timeout
    return total
