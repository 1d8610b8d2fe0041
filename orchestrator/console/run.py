"""The run page: the count of tasks in each state, and one page of its tasks, each with its
attempts, its root cause and the actions it allows (a 10,000-task run is read and drawn a page
at a time)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count
from django.urls import reverse

from orchestrator.console import rootcause
from orchestrator.console.attempts import AttemptView, attempt_view, dead_lettered_at
from orchestrator.console.choices import ActionChoice, BulkChoice, Operator, bulk_choice, choice
from orchestrator.console.grid import waiting_words
from orchestrator.console.paging import Span, page_count
from orchestrator.console.text import attempt_label, pretty_json
from orchestrator.data.queue_listeners import listened_queues
from orchestrator.models import DagRun, TaskInstance
from orchestrator.operations.action_registry import RUN_OFFERS, BulkOffer
from orchestrator.operations.documents import in_task_order, waiting_for
from retries.states import FINISHED_RUN_STATES, TaskState

# Task rows per page of the run page.
RUN_PAGE_SIZE = 200


@dataclass
class TaskInstanceView:
    ti: TaskInstance
    attempts: list[AttemptView]
    last_category: str
    last_reason: str
    last_is_history: bool  # the task succeeded since: its last failure is not a current one
    url: str
    buttons: list[ActionChoice]
    cause: rootcause.RootCause | None = None  # the task's own last failure, whatever an operator did since
    action: rootcause.OperatorAction | None = None  # the operator's last action on it, if that is its context
    waiting: str = ""  # what it waits for, in words (a queue no live worker reads, for one)

    @property
    def label(self) -> str:
        return self.ti.label

    @property
    def tries(self) -> str:
        return attempt_label(self.ti.try_number, self.ti.max_tries)


def task_instance_views(run: DagRun, operator: Operator, *, offset: int = 0, limit: int | None = None) -> list[TaskInstanceView]:
    dead_lettered = dead_lettered_at(run)
    rows = run.task_instances.filter(map_index__gte=-1).select_related("definition").order_by("id")  # not parked rows
    if limit is not None:
        rows = rows[offset : offset + limit]
    instances = in_task_order(rows.prefetch_related("attempts"))
    allowed = operator.allowed(instances)
    listened = listened_queues() if any(ti.state == TaskState.QUEUED for ti in instances) else None
    views = []
    for ti in instances:
        ti.dag_run = run
        attempts = sorted(ti.attempts.all(), key=lambda a: a.attempt_token)
        context = ti.last_failure_context or {}
        facts = rootcause.facts_of(attempts)
        tipped = rootcause.tipping_tokens(facts, ti.state, dead_lettered.get(ti.task_id, []))
        cause = rootcause.root_cause(facts, context, max_tries=ti.max_tries, infrastructure_retry_limit=ti.infrastructure_retry_limit, tipped=tipped)
        views.append(
            TaskInstanceView(
                ti=ti,
                attempts=[attempt_view(a, f, ti, tipped, output=a.stderr or "") for a, f in zip(attempts, facts)],
                last_category=cause.category if cause else "",
                last_reason=cause.reason if cause else "",
                last_is_history=cause is not None and ti.state == TaskState.SUCCESS,
                url=reverse("web:task_detail", args=[run.dag.dag_id, run.run_id, ti.task_id])
                + (f"?map_index={ti.map_index}" if ti.map_index >= 0 else ""),
                buttons=[_button(run, ti, name) for name in allowed.get(ti.pk, ())],
                cause=cause,
                action=rootcause.operator_action(context),
                waiting=waiting_words(waiting_for(ti, listened), ti.state),
            )
        )
    return views


def _button(run: DagRun, ti: TaskInstance, name: str) -> ActionChoice:
    url = reverse(f"web:task_{name}", args=[run.dag.dag_id, run.run_id, ti.task_id])
    return choice(name, url, ti)


def _run_offer(run: DagRun, offer: BulkOffer) -> BulkChoice:
    """What the run page offers on its failed tasks: POST .../runs/RUN_ID/ACTION_SCOPE."""
    return bulk_choice(offer, reverse(f"web:run_{offer.action}_{offer.scope}", args=[run.dag.dag_id, run.run_id]))


def context(run: DagRun, operator: Operator, *, action_error: str = "", notice: str = "", page: int = 1) -> dict[str, Any]:
    """The context of the run page and of its #run-body partial: one page of its tasks."""
    counts = dict(run.task_instances.filter(map_index__gte=-1).order_by().values_list("state").annotate(n=Count("id")))
    total = sum(counts.values())
    page = min(max(1, page), page_count(total, RUN_PAGE_SIZE))
    offset = (page - 1) * RUN_PAGE_SIZE
    views = task_instance_views(run, operator, offset=offset, limit=RUN_PAGE_SIZE)
    has_failed = counts.get(TaskState.FAILED, 0) > 0
    return {
        "task_page": Span.of(page, RUN_PAGE_SIZE, total, len(views)),
        "task_counts": "({})".format(", ".join(f"{state} {n}" for state, n in sorted(counts.items()))),
        "dag": run.dag,
        "run": run,
        "finished": run.state in FINISHED_RUN_STATES,
        "task_instances": views,
        "deadlines": list(run.deadlines.all().order_by("need_by", "id")),
        "conf": pretty_json(run.conf),
        "action_error": action_error,
        "notice": notice,
        "may_act": operator.may_act,
        "run_offers": [_run_offer(run, offer) for offer in RUN_OFFERS] if has_failed else [],
    }
