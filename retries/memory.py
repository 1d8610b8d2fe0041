"""Memory limits: what a task's memory keys may hold, and the limit and queue of its next attempt.

Pure: no Django, no database. The spec checks (`orchestrator/specs/memory_schema.py`) and the
report of a failed attempt (`engine/reporting.py`) both read these rules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from retries.states import Reason

# Below this a Python task cannot even start (its interpreter alone is some 10 MiB).
MIN_LIMIT_MIB = 16
# MiB: a limit larger than any machine (1 PiB) is a typo, and must fit a 64-bit byte count.
MAX_LIMIT_MIB = 1 << 30
MEMORY_KEYS = ("memory_limit", "memory_limit_on_retry", "queue_on_oom")


@dataclass(frozen=True)
class MemoryArgs:
    """A task's effective memory keys."""

    memory_limit: int | None = None
    memory_limit_on_retry: tuple[int, ...] = ()
    queue_on_oom: str | None = None

    @classmethod
    def of(cls, args: dict[str, Any]) -> MemoryArgs:
        """From a task's effective arguments (taskconfig), as validated at import."""
        limit = args.get("memory_limit")
        steps = args.get("memory_limit_on_retry") or ()
        return cls(
            memory_limit=int(limit) if limit is not None else None,
            memory_limit_on_retry=tuple(int(step) for step in steps),
            queue_on_oom=args.get("queue_on_oom") or None,
        )


def limit_problem(value: object) -> str | None:
    """What is wrong with a `memory_limit`, or None."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_LIMIT_MIB <= value <= MAX_LIMIT_MIB:
        return f"must be a whole number of MiB >= {MIN_LIMIT_MIB}, or null for no limit; not {value!r}"
    return None


def steps_problem(value: object) -> str | None:
    """What is wrong with a `memory_limit_on_retry` on its own, or None."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(_is_int(step) for step in value):
        return f"must be a list of whole numbers of MiB, not {value!r}"
    if any(not MIN_LIMIT_MIB <= step <= MAX_LIMIT_MIB for step in value):
        return f"each limit must be a whole number of MiB >= {MIN_LIMIT_MIB}; not {list(value)!r}"
    if any(later <= earlier for earlier, later in zip(value, value[1:], strict=False)):
        return f"must grow strictly, each limit larger than the one before; not {list(value)!r}"
    return None


def together_problem(memory_limit: object, steps: object) -> str | None:
    """What is wrong with `memory_limit_on_retry` given the task's `memory_limit` (both already
    valid on their own), or None."""
    if not steps:
        return None
    if memory_limit is None:
        return "needs memory_limit: the first attempt's limit, which the list steps up from"
    assert isinstance(steps, (list, tuple))
    if steps[0] <= memory_limit:
        return f"must start above memory_limit ({memory_limit} MiB); not {list(steps)!r}"
    return None


def next_limit(current: int | None, memory: MemoryArgs) -> int | None:
    """The limit of the attempts after one that went past `current`: the next value of
    `memory_limit_on_retry` above it, the last one repeated; `current` when there is none."""
    if current is None:
        return None
    for step in memory.memory_limit_on_retry:
        if step > current:
            return step
    return memory.memory_limit_on_retry[-1] if memory.memory_limit_on_retry else current


@dataclass(frozen=True)
class AfterFailure:
    """What a failed attempt changes for the task's later attempts: its limit, its queue."""

    memory_limit_mib: int | None
    queue: str


def after_failure(reason: Reason, current_limit: int | None, current_queue: str, memory: MemoryArgs) -> AfterFailure:
    """Each `memory_limit_exceeded` steps the limit up (`next_limit`) and sends every later
    attempt to `queue_on_oom` when set; any other failure keeps both."""
    if reason is not Reason.MEMORY_LIMIT_EXCEEDED:
        return AfterFailure(current_limit, current_queue)
    return AfterFailure(next_limit(current_limit, memory), memory.queue_on_oom or current_queue)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def exceeded_fingerprint(fingerprint: str | None, reason: Reason) -> str | None:
    """A `memory_limit_exceeded` failure carries no fingerprint: it never counts towards
    `poison_threshold` (running out of a budget it may get more of is no bug repeating)."""
    return None if reason is Reason.MEMORY_LIMIT_EXCEEDED else fingerprint
