"""What the console shows of a mapped task: one grid cell for all its instances (counts by
state, coloured by the worst), and the task page's list of instances with what can be done to
all of them, or to the failed ones, at once."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.console.choices import Operator
from orchestrator.console.text import attempt_label
from orchestrator.models import TaskInstance
from retries.states import TaskState

# The state a mapped task's cell takes: the first of these any instance is in.
WORST_FIRST = (
    TaskState.DEAD_LETTER, TaskState.FAILED, TaskState.UPSTREAM_FAILED, TaskState.UP_FOR_RETRY,
    TaskState.RUNNING, TaskState.QUEUED, TaskState.SCHEDULED, TaskState.NONE,
    TaskState.SKIPPED, TaskState.REMOVED, TaskState.SUCCESS,
)


def worst_state(states: Iterable[str]) -> str:
    present = set(states)
    return next((str(state) for state in WORST_FIRST if state in present), TaskState.NONE.value)


def counts_text(states: Iterable[str]) -> str:
    """'3 instances: 2 success, 1 failed' (worst first)."""
    counts = Counter(states)
    total = sum(counts.values())
    parts = [f"{counts[s]} {s}" for s in WORST_FIRST if counts.get(s)]
    return f"{total} instance{'' if total == 1 else 's'}: {', '.join(parts)}"


def is_mapped(instances: list[TaskInstance]) -> bool:
    return any(ti.map_index >= 0 for ti in instances)


@dataclass(frozen=True)
class InstanceRow:
    map_index: int
    state: str
    tries: str
    last_failure: str  # "category/reason", or ""
    url: str


@dataclass(frozen=True)
class BulkChoice:
    name: str
    label: str
    url: str
    explanation: str
    scope: str  # "all" | "failed"
    danger: bool = False


def overview(
    instances: list[TaskInstance], base_url: str, operator: Operator, state_filter: str = ""
) -> dict[str, Any]:
    """The mapped task's page: its instances (filtered by state), counts, bulk actions."""
    states = [ti.state for ti in instances]
    shown = [ti for ti in instances if not state_filter or ti.state == state_filter]
    rows = [
        InstanceRow(
            map_index=ti.map_index,
            state=ti.state,
            tries=attempt_label(ti.try_number, ti.max_tries),
            last_failure=_failure(ti.last_failure_context),
            url=f"{base_url}?map_index={ti.map_index}",
        )
        for ti in shown
    ]
    return {
        "instances": rows,
        "counts": counts_text(states),
        "state_counts": sorted(Counter(states).items(), key=lambda item: WORST_FIRST.index(TaskState(item[0]))),
        "state_filter": state_filter,
        "worst_state": worst_state(states),
        "bulk_choices": bulk_choices(instances, base_url, operator),
    }


def bulk_choices(instances: list[TaskInstance], base_url: str, operator: Operator) -> list[BulkChoice]:
    """Actions on every instance, or on the failed ones; each instance is acted on and audited
    on its own, and one whose state refuses the action is left as it is. A choice is offered
    when at least one instance of its scope allows the action."""
    allowed = operator.allowed(instances)
    failed = selected(instances, "failed")

    def any_allows(action: str, scope: list[TaskInstance]) -> bool:
        return any(action in allowed.get(ti.pk, ()) for ti in scope)

    n, f = len(instances), len(failed)
    offered = [
        BulkChoice("clear", f"Clear all {n}", f"{base_url}/clear",
                   f"Every one of the {n} instances that is finished runs again with a fresh set of tries.", "all"),
        BulkChoice("clear", f"Clear the {f} failed", f"{base_url}/clear",
                   f"The {f} failed or dead-lettered instances run again with a fresh set of tries.", "failed"),
        BulkChoice("reclassify", f"Reclassify the {f} failed", f"{base_url}/reclassify",
                   "Each failed instance's last user-charged failure is charged to the platform; its try is given back.", "failed"),
        BulkChoice("mark_success", f"Mark the {f} failed success", f"{base_url}/mark_success",
                   "The failed instances are recorded as succeeded (with a null result) without running.", "failed"),
        BulkChoice("mark_success", f"Mark all {n} success", f"{base_url}/mark_success",
                   "Every instance that has not succeeded is recorded as succeeded without running.", "all"),
        BulkChoice("mark_failed", f"Mark all {n} failed", f"{base_url}/mark_failed",
                   "Every instance is recorded as failed and not retried; queued and running ones are stopped.", "all", danger=True),
    ]  # fmt: skip
    return [c for c in offered if any_allows(c.name, failed if c.scope == "failed" else instances)]


def selected(instances: list[TaskInstance], scope: str) -> list[TaskInstance]:
    """The instances a bulk action's scope names."""
    if scope == "failed":
        return [ti for ti in instances if ti.state in (TaskState.FAILED, TaskState.DEAD_LETTER)]
    return instances


def _failure(context: dict[str, Any] | None) -> str:
    if not context:
        return ""
    return f"{context.get('category', '')}/{context.get('reason', '')}"
