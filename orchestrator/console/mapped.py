"""What the console shows of a mapped task: one grid cell for all its instances (counts by
state, coloured by the worst), and the task page's list of instances with what can be done to
all of them, or to the failed ones, at once.

A mapped task may have 10,000 instances: the page counts them by state in the database and
reads one page of them (`INSTANCES_PER_PAGE`), so its queries and rows are the same whatever
their number."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Count

from orchestrator.console.choices import BulkChoice, Operator, bulk_choice
from orchestrator.console.paging import Span, page_count
from orchestrator.console.text import attempt_label
from orchestrator.models import DagRun, TaskInstance
from orchestrator.operations.action_registry import MAPPED_TASK_OFFERS
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


INSTANCES_PER_PAGE = 200
FAILED_STATES = (TaskState.FAILED, TaskState.DEAD_LETTER)


def counts_text(counts: Mapping[str, int]) -> str:
    """'3 instances: 2 success, 1 failed' (worst first), from the number in each state."""
    total = sum(counts.values())
    parts = [f"{counts[s]} {s}" for s in WORST_FIRST if counts.get(s)]
    return f"{total} instance{'' if total == 1 else 's'}: {', '.join(parts)}"



@dataclass(frozen=True)
class InstanceRow:
    map_index: int
    state: str
    tries: str
    last_failure: str  # "category/reason", or ""
    url: str


def state_counts(run: DagRun, task_id: str) -> dict[str, int]:
    """How many of the task's instances are in each state (empty: the task is not mapped)."""
    rows = (
        TaskInstance.objects.filter(dag_run=run, task_id=task_id, map_index__gte=0)
        .values_list("state").annotate(n=Count("id")).values_list("state", "n").order_by()
    )
    return dict(rows)


def overview(
    run: DagRun, task_id: str, counts: Mapping[str, int], base_url: str, operator: Operator,
    state_filter: str = "", page: int = 1,
) -> dict[str, Any]:
    """The mapped task's page: counts by state, one page of its instances (filtered by state),
    and the bulk actions."""
    if state_filter not in counts:
        state_filter = "" if state_filter not in {s.value for s in TaskState} else state_filter
    total = counts.get(state_filter, 0) if state_filter else sum(counts.values())
    number = min(max(page, 1), page_count(total, INSTANCES_PER_PAGE))
    shown = TaskInstance.objects.filter(dag_run=run, task_id=task_id, map_index__gte=0)
    if state_filter:
        shown = shown.filter(state=state_filter)
    start = (number - 1) * INSTANCES_PER_PAGE
    fields = ("id", "map_index", "state", "try_number", "max_tries", "last_failure_context")
    rows = [
        InstanceRow(
            map_index=ti.map_index,
            state=ti.state,
            tries=attempt_label(ti.try_number, ti.max_tries),
            last_failure=_failure(ti.last_failure_context),
            url=f"{base_url}?map_index={ti.map_index}",
        )
        for ti in shown.only(*fields).order_by("map_index")[start : start + INSTANCES_PER_PAGE]
    ]
    return {
        "instances": rows,
        "page": Span.of(number, INSTANCES_PER_PAGE, total, len(rows)),
        "counts": counts_text(counts),
        "state_counts": sorted(counts.items(), key=lambda item: WORST_FIRST.index(TaskState(item[0]))),
        "state_filter": state_filter,
        "worst_state": worst_state(counts),
        "bulk_choices": bulk_choices(counts, base_url, operator.allowed_by_state(run, task_id) if operator.may_act else {}),
    }


def bulk_choices(counts: Mapping[str, int], base_url: str, allowed_by_state: Mapping[str, Sequence[str]]) -> list[BulkChoice]:
    """Actions on every instance, or on the failed ones; each instance is acted on and audited
    on its own, and one whose state refuses the action is left as it is. A choice is offered
    when at least one instance of its scope allows the action (`allowed_by_state`: what an
    instance in each state allows, as `orchestrator.operations.actions` decides it), read from the counts:
    the same work at 10 instances as at 10,000."""
    n = sum(counts.values())
    f = sum(counts.get(state, 0) for state in FAILED_STATES)
    present = [state for state, count in counts.items() if count]

    def any_allows(action: str, scope: str) -> bool:
        states = [s for s in present if s in FAILED_STATES] if scope == "failed" else present
        return any(action in allowed_by_state.get(s, ()) for s in states)

    return [
        bulk_choice(offer, f"{base_url}/{offer.action}", n=n, f=f)
        for offer in MAPPED_TASK_OFFERS
        if any_allows(offer.action, offer.scope)
    ]


def selected(instances: list[TaskInstance], scope: str) -> list[TaskInstance]:
    """The instances a bulk action's scope names."""
    if scope == "failed":
        return [ti for ti in instances if ti.state in FAILED_STATES]
    return instances


def _failure(context: dict[str, Any] | None) -> str:
    if not context:
        return ""
    return f"{context.get('category', '')}/{context.get('reason', '')}"
