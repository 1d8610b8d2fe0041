"""What the pages show, computed here so that templates hold no rules."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, Exists, F, OuterRef, Window
from django.db.models.functions import RowNumber
from django.urls import reverse

from orchestrator.actions import ACT_PERMISSION, TRIGGER_PERMISSION
from orchestrator.console import rootcause
from orchestrator.console.text import Row, attempt_label, context_rows
from orchestrator.documents import in_task_order
from orchestrator.models import AuditLog, Dag, DagRun, TaskAttempt, TaskInstance
from orchestrator.taskconfig import args_for, effective_args
from retries.policy import cleared_max_tries
from retries.states import (
    ACTIVE_TASK_STATES,
    CLEAR_FROM,
    FINISHED_RUN_STATES,
    MARK_FAILED_FROM,
    MARK_SUCCESS_FROM,
    AttemptKind,
    TaskState,
)

RECENT_RUNS_PER_DAG = 5


def pretty_json(value: Any) -> str:
    """Indented JSON for a <pre> block; templates escape it."""
    if value in (None, {}, []):
        return ""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@dataclass
class DagRow:
    dag: Dag
    recent_runs: list[DagRun] = field(default_factory=list)


def dag_rows() -> list[DagRow]:
    """Every DAG with its last few runs (newest first), in two queries."""
    dags = list(Dag.objects.order_by("dag_id"))
    rows = {dag.pk: DagRow(dag) for dag in dags}
    dead = TaskInstance.objects.filter(dag_run=OuterRef("pk"), state=TaskState.DEAD_LETTER)
    recent = (
        DagRun.objects.annotate(
            needs_attention=Exists(dead),
            position=Window(RowNumber(), partition_by=F("dag_id"), order_by=[F("queued_at").desc(), F("id").desc()])
        )
        .filter(position__lte=RECENT_RUNS_PER_DAG)
        .order_by("dag_id", "position")
    )
    for run in recent:
        run.dag = rows[run.dag_id].dag
        rows[run.dag_id].recent_runs.append(run)
    return list(rows.values())


@dataclass
class TaskRow:
    task_id: str
    upstream: list[str]
    trigger_rule: str
    command: str
    retries: int
    infrastructure_retry_limit: int
    queue: str


def task_rows(dag: Dag) -> list[TaskRow]:
    rows = []
    for task in dag.tasks.all():
        task.dag = dag
        args = effective_args(task)
        rows.append(
            TaskRow(
                task_id=task.task_id,
                upstream=list(task.upstream),
                trigger_rule=task.trigger_rule,
                command=task.python_callable or task.bash_command,
                retries=int(args["retries"]),
                infrastructure_retry_limit=int(args["infrastructure_retry_limit"]),
                queue=str(args["queue"]),
            )
        )
    return rows


@dataclass
class AttemptView:
    attempt: TaskAttempt
    category: str
    reason: str
    source: str
    metadata: list[Row]
    traceback: str  # '' when stderr already holds it: it is shown once
    number: int = 0  # 1-based position among the task's attempts
    budget: str = ""  # what it was: "user try 2 of 3" / "platform retry 1 of 5"
    budget_kind: str = ""  # user / platform: which of the two it was
    charged: str = ""  # which budget paid for its failure ('' unless it failed)
    poisoned: bool = False  # this attempt dead-lettered the task

    @classmethod
    def of(cls, attempt: TaskAttempt, fact: rootcause.AttemptFacts | None = None, ti: TaskInstance | None = None, poisoned: bool = False) -> AttemptView:
        context = attempt.context or {}
        traceback = str((context.get("metadata") or {}).get("traceback") or "")
        if traceback and traceback.strip()[-200:] in (attempt.stderr or ""):
            traceback = ""
        return cls(
            attempt=attempt,
            category=context.get("category", ""),
            reason=context.get("reason", ""),
            source=context.get("source", ""),
            metadata=[r for r in context_rows(context, skip=frozenset({"traceback"})) if r.key not in ("category", "reason", "source")],
            traceback=traceback,
            number=fact.number if fact else 0,
            budget=rootcause.attempt_label(fact.previous_kind, attempt.try_number, attempt.infrastructure_try_number, ti.max_tries, ti.infrastructure_retry_limit) if fact and ti else "",
            budget_kind=AttemptKind.PLATFORM if fact and fact.previous_kind == AttemptKind.PLATFORM else AttemptKind.USER,
            charged=rootcause.charged_to(attempt.kind) if attempt.state == TaskAttempt.State.FAILED and not rootcause.is_action(context) else "",
            poisoned=poisoned,
        )


ACTION_LABELS = {
    "clear": "Clear",
    "mark_success": "Mark success",
    "mark_failed": "Mark failed",
    "reclassify": "Reclassify as platform failure",
}


@dataclass(frozen=True)
class ActionButton:
    """One action offered on the run page, shaped like console.taskinstance.ActionChoice."""

    name: str
    label: str
    url: str
    explanation: str = ""
    danger: bool = False
    downstream_option: bool = False
    map_index: int | None = None  # a mapped task's instance it acts on


def explain(ti: TaskInstance, name: str) -> str:
    """What the action will do, in words (the task page spells out more: downstream tasks by name)."""
    if name == "clear":
        more = cleared_max_tries(ti.try_number, int(args_for(ti)["retries"])) - ti.try_number
        return f"the task runs again with {more} more tr{'y' if more == 1 else 'ies'}; its upstream_failed downstream tasks run after it."
    if name == "mark_success":
        return "the task is recorded as succeeded without running; its downstream tasks may start."
    if name == "mark_failed":
        if ti.state in ACTIVE_TASK_STATES:
            return f"stops the {ti.state} task (SIGTERM, then SIGKILL after the kill grace) and records it as failed, not retried."
        return "the task is recorded as failed and not retried."
    return (
        f"its last user-charged failure is charged to the platform: that try repeats (attempt {ti.try_number} of "
        f"{ti.max_tries} again), using platform retry {ti.infrastructure_try_number + 1} of {ti.infrastructure_retry_limit}."
    )


@dataclass
class TaskInstanceView:
    ti: TaskInstance
    attempts: list[AttemptView]
    last_category: str
    last_reason: str
    last_is_history: bool  # the task succeeded since: its last failure is not a current one
    url: str
    buttons: list[ActionButton]
    cause: rootcause.RootCause | None = None  # the task's own last failure, whatever an operator did since
    action: rootcause.OperatorAction | None = None  # the operator's last action on it, if that is its context

    @property
    def label(self) -> str:
        return self.ti.task_id if self.ti.map_index < 0 else f"{self.ti.task_id}[{self.ti.map_index}]"

    @property
    def tries(self) -> str:
        return attempt_label(self.ti.try_number, self.ti.max_tries)

    def button(self, name: str) -> ActionButton | None:
        return next((b for b in self.buttons if b.name == name), None)

    @property
    def clear(self) -> ActionButton | None:
        return self.button("clear")

    @property
    def mark_success(self) -> ActionButton | None:
        return self.button("mark_success")

    @property
    def mark_failed(self) -> ActionButton | None:
        return self.button("mark_failed")

    @property
    def reclassify(self) -> ActionButton | None:
        return self.button("reclassify")


def allowed_actions(ti: TaskInstance, attempts: list[TaskAttempt]) -> list[str]:
    """The operator actions that apply to `ti` in its current state (orchestrator.actions rules)."""
    allowed = []
    if ti.state in CLEAR_FROM:
        allowed.append("clear")
    if ti.state in MARK_SUCCESS_FROM:
        allowed.append("mark_success")
    if ti.state in MARK_FAILED_FROM or ti.state in ACTIVE_TASK_STATES:  # stops a queued or running task
        allowed.append("mark_failed")
    user_failure = any(a.kind == AttemptKind.USER and a.state == TaskAttempt.State.FAILED for a in attempts)
    if ti.state not in ACTIVE_TASK_STATES and user_failure:
        allowed.append("reclassify")
    return allowed


# Task rows per page of the run page: a 10,000-task run is read and drawn a page at a time,
# with the count of tasks in each state for the whole run above it.
RUN_PAGE_SIZE = 200


def task_instance_views(
    run: DagRun, user: AbstractBaseUser | AnonymousUser, *, offset: int = 0, limit: int | None = None
) -> list[TaskInstanceView]:
    may_act = user.has_perm(ACT_PERMISSION)
    dead_lettered: dict[str, list] = {}
    for task_id, at in AuditLog.objects.filter(dag_id=run.dag.dag_id, run_id=run.run_id, prior_state=TaskState.DEAD_LETTER).order_by("at").values_list("task_id", "at"):
        dead_lettered.setdefault(task_id, []).append(at)
    views = []
    rows = run.task_instances.select_related("definition").order_by("id")
    if limit is not None:
        rows = rows[offset : offset + limit]
    for ti in in_task_order(rows.prefetch_related("attempts")):
        ti.dag_run = run
        attempts = sorted(ti.attempts.all(), key=lambda a: a.attempt_token)
        context = ti.last_failure_context or {}
        facts = rootcause.facts_of(attempts)
        tipped = rootcause.tipping_tokens(facts, ti.state, dead_lettered.get(ti.task_id, []))
        cause = rootcause.root_cause(facts, context, max_tries=ti.max_tries, infrastructure_retry_limit=ti.infrastructure_retry_limit, tipped=tipped)
        views.append(
            TaskInstanceView(
                ti=ti,
                attempts=[
                    AttemptView.of(a, f, ti, a.attempt_token in tipped)
                    for a, f in zip(attempts, facts)
                ],
                last_category=cause.category if cause else "",
                last_reason=cause.reason if cause else "",
                last_is_history=cause is not None and ti.state == TaskState.SUCCESS,
                url=reverse("web:task_detail", args=[run.dag.dag_id, run.run_id, ti.task_id])
                + (f"?map_index={ti.map_index}" if ti.map_index >= 0 else ""),
                buttons=[_button(run, ti, name) for name in allowed_actions(ti, attempts)] if may_act else [],
                cause=cause,
                action=rootcause.operator_action(context),
            )
        )
    return views


def _button(run: DagRun, ti: TaskInstance, name: str) -> ActionButton:
    url = reverse(f"web:task_{name}", args=[run.dag.dag_id, run.run_id, ti.task_id])
    return ActionButton(
        name, ACTION_LABELS[name], url, explain(ti, name), danger=name == "mark_failed", downstream_option=name == "clear",
        map_index=ti.map_index if ti.map_index >= 0 else None,
    )


DONE = {
    "clear": "Cleared {task}: it runs again with a fresh set of tries.",
    "mark_success": "Marked {task} success.",
    "mark_failed": "Marked {task} failed.",
    "reclassify": "Reclassified the last failure of {task} as the platform's: that try repeats.",
}


def action_done(action: str, task_id: str, note: str) -> str:
    """The confirmation an operator reads after one action on one task."""
    text = DONE[action].format(task=task_id)
    return f"{text} Noted: “{note}”." if note else text


def run_context(
    run: DagRun, user: AbstractBaseUser | AnonymousUser, *, action_error: str = "", notice: str = "", page: int = 1
) -> dict[str, Any]:
    """The context of the run page and of its #run-body partial: one page of its tasks."""
    counts = dict(run.task_instances.order_by().values_list("state").annotate(n=Count("id")))
    total = sum(counts.values())
    pages = max(1, -(-total // RUN_PAGE_SIZE))
    page = min(max(1, page), pages)
    offset = (page - 1) * RUN_PAGE_SIZE
    views = task_instance_views(run, user, offset=offset, limit=RUN_PAGE_SIZE)
    return {
        "task_page": {
            "number": page,
            "pages": pages,
            "first": offset + 1 if total else 0,
            "last": offset + len(views),
            "total": total,
            "previous": page - 1 if page > 1 else None,
            "next": page + 1 if page < pages else None,
            "state_counts": sorted(counts.items()),
        },
        "dag": run.dag,
        "run": run,
        "finished": run.state in FINISHED_RUN_STATES,
        "task_instances": views,
        "deadlines": list(run.deadlines.all().order_by("need_by", "id")),
        "conf": pretty_json(run.conf),
        "action_error": action_error,
        "notice": notice,
        "may_act": user.has_perm(ACT_PERMISSION),
        "has_failed": counts.get(TaskState.FAILED, 0) > 0,
    }


def may_trigger(user: AbstractBaseUser | AnonymousUser) -> bool:
    return user.has_perm(TRIGGER_PERMISSION)
