"""What the console shows of a mapped task: one grid cell for all its instances (counts by
state, coloured by the worst), and the task page's list of instances with what can be done to
all of them, or to the failed ones, at once."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from orchestrator import actions
from orchestrator.console.text import attempt_label
from orchestrator.models import TaskInstance
from retries.states import ACTIVE_TASK_STATES, CLEAR_FROM, MARK_FAILED_FROM, MARK_SUCCESS_FROM, TaskState

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
    instances: list[TaskInstance], base_url: str, user: AbstractBaseUser | AnonymousUser, state_filter: str = ""
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
        "bulk_choices": bulk_choices(instances, base_url, user),
    }


def bulk_choices(instances: list[TaskInstance], base_url: str, user: AbstractBaseUser | AnonymousUser) -> list[BulkChoice]:
    """Actions on every instance, or on the failed ones; each instance is acted on and audited
    on its own, and one whose state refuses the action is left as it is."""
    if not user.has_perm(actions.ACT_PERMISSION):  # type: ignore[union-attr]
        return []
    n = len(instances)
    failed = sum(1 for ti in instances if ti.state in (TaskState.FAILED, TaskState.DEAD_LETTER))
    out = []
    if any(ti.state in CLEAR_FROM for ti in instances):
        out.append(BulkChoice("clear", f"Clear all {n}", f"{base_url}/clear",
                              f"Every one of the {n} instances that is finished runs again with a fresh set of tries.", "all"))
    if failed:
        out.append(BulkChoice("clear", f"Clear the {failed} failed", f"{base_url}/clear",
                              f"The {failed} failed or dead-lettered instances run again with a fresh set of tries.", "failed"))
        out.append(BulkChoice("reclassify", f"Reclassify the {failed} failed", f"{base_url}/reclassify",
                              "Each failed instance's last user-charged failure is charged to the platform; its try is given back.", "failed"))
        out.append(BulkChoice("mark_success", f"Mark the {failed} failed success", f"{base_url}/mark_success",
                              "The failed instances are recorded as succeeded (with a null result) without running.", "failed"))
    if any(ti.state in MARK_SUCCESS_FROM for ti in instances):
        out.append(BulkChoice("mark_success", f"Mark all {n} success", f"{base_url}/mark_success",
                              "Every instance that has not succeeded is recorded as succeeded without running.", "all"))
    if any(ti.state in MARK_FAILED_FROM or ti.state in ACTIVE_TASK_STATES for ti in instances):
        out.append(BulkChoice("mark_failed", f"Mark all {n} failed", f"{base_url}/mark_failed",
                              "Every instance is recorded as failed and not retried; queued and running ones are stopped.", "all",
                              danger=True))
    return out


def selected(instances: list[TaskInstance], scope: str) -> list[TaskInstance]:
    """The instances a bulk action's scope names."""
    if scope == "failed":
        return [ti for ti in instances if ti.state in (TaskState.FAILED, TaskState.DEAD_LETTER)]
    return instances


def _failure(context: dict[str, Any] | None) -> str:
    if not context:
        return ""
    return f"{context.get('category', '')}/{context.get('reason', '')}"
