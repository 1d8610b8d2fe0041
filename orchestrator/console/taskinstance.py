"""The task instance page: every physical attempt to scale, why each failed, its output, and
what each operator action would do, spelled out before anyone confirms it.

Queries: the attempts (output cut to its head and tail in the database), the run's task
instances (for the downstream tasks an action touches) and one count of the task instances
that failed with the same fingerprint, and the task state's entries; none grows with the history.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models.functions import Left, Length, Right
from django.urls import reverse
from django.utils import timezone

from orchestrator import actions
from orchestrator.console import mapped, rootcause
from orchestrator.console.grid import waiting_text
from orchestrator.console.text import Excerpt, Row, attempt_label, context_rows, duration, excerpt, seconds_between
from orchestrator.engine import taskstate
from orchestrator.engine.taskconfig import args_for
from orchestrator.models import AuditLog, DagRun, TaskAttempt, TaskInstance
from retries.policy import cleared_max_tries
from retries.states import (
    ACTIVE_TASK_STATES,
    CLEAR_FROM,
    MARK_FAILED_FROM,
    MARK_SUCCESS_FROM,
    AttemptKind,
    TaskState,
)

# Bytes of each stream read from the database for the excerpt; the whole text is one link away.
OUTPUT_WINDOW = 16_000
STREAMS = ("stdout", "stderr")


@dataclass(frozen=True)
class Output:
    stream: str
    excerpt: Excerpt
    size: int
    url: str
    cut_in_database: bool  # the stored text is longer than the two windows read


@dataclass
class AttemptView:
    attempt: TaskAttempt
    number: int  # 1-based position among the physical attempts
    category: str
    reason: str
    source: str
    duration: str
    offset_percent: float
    width_percent: float
    context: list[Row]
    traceback: str
    outputs: list[Output] = field(default_factory=list)
    budget: str = ""  # what it was: "user try 2 of 3" / "platform retry 1 of 5"
    budget_kind: str = ""  # user / platform: which of the two it was
    charged: str = ""  # which budget paid for its failure ('' unless it failed)
    poisoned: bool = False  # this attempt dead-lettered the task

    @property
    def resume_label(self) -> str:
        """What a resumable task decided on this attempt, in words ("" for other tasks)."""
        return (self.attempt.resume or "").replace("_", " ")


@dataclass(frozen=True)
class ActionChoice:
    name: str
    label: str
    url: str
    explanation: str
    danger: bool = False
    downstream_option: bool = False
    map_index: int | None = None  # a mapped task's instance this acts on
    task_state_option: bool = False  # clear: offer to keep the task state


# A result longer than this (as pretty JSON) is shown folded.
RESULT_FOLD_CHARS = 1500
RESULT_FOLD_LINES = 20


@dataclass(frozen=True)
class ResultView:
    text: str
    folded: bool
    summary: str  # what the folded result is: "dict, 120 lines, 4,210 characters"


def result_view(result: Any) -> ResultView | None:
    """A succeeded task's result as pretty JSON; long ones folded behind a summary."""
    if result is None:
        return None
    text = json.dumps(result, indent=2, ensure_ascii=False, sort_keys=True)
    lines = text.count("\n") + 1
    kinds: dict[type, str] = {dict: "object", list: "list", str: "string"}
    kind = kinds.get(type(result), type(result).__name__)
    size = f"{len(result)} item{'s' if len(result) != 1 else ''}, " if isinstance(result, (dict, list)) else ""
    folded = len(text) > RESULT_FOLD_CHARS or lines > RESULT_FOLD_LINES
    return ResultView(text, folded, f"{kind}, {size}{lines} lines, {len(text):,} characters")


def task_url(dag_id: str, run_id: str, task_id: str) -> str:
    return reverse("web:task_detail", args=[dag_id, run_id, task_id])


def attempt_views(ti: TaskInstance, base_url: str, now: datetime, query: str = "") -> tuple[list[AttemptView], list[TaskAttempt]]:
    windows = {}
    for stream in STREAMS:
        windows[f"{stream}_head"] = Left(stream, OUTPUT_WINDOW)
        windows[f"{stream}_tail"] = Right(stream, OUTPUT_WINDOW)
        windows[f"{stream}_size"] = Length(stream)
    attempts = list(ti.attempts.defer(*STREAMS).annotate(**windows).order_by("attempt_token"))
    starts = [a.start_date or a.queued_at for a in attempts]
    ends = [a.end_date or (now if a.state in ("queued", "running") else (a.start_date or a.queued_at)) for a in attempts]
    first = min(starts, default=now)
    span = max((seconds_between(first, max(ends, default=now)) or 0.0), 0.001)
    views = []
    for number, (attempt, start, end) in enumerate(zip(attempts, starts, ends), start=1):
        context = attempt.context or {}
        metadata = context.get("metadata") or {}
        traceback = str(metadata.get("traceback") or "")
        outputs = _outputs(attempt, f"{base_url}/attempts/{attempt.attempt_token}", query)
        # The traceback is shown once: in stderr when the task printed it there, else here.
        if traceback and any(traceback.strip()[-200:] in (o.excerpt.head + o.excerpt.tail) for o in outputs):
            traceback = ""
        secs = seconds_between(attempt.start_date, attempt.end_date or (now if attempt.state == "running" else None))
        views.append(
            AttemptView(
                attempt=attempt,
                number=number,
                category=context.get("category", ""),
                reason=context.get("reason", ""),
                source=context.get("source", ""),
                duration=duration(secs) if secs is not None else ("did not start" if attempt.state == "failed" else ""),
                offset_percent=round(100 * (seconds_between(first, start) or 0.0) / span, 2),
                width_percent=max(0.6, round(100 * (seconds_between(start, end) or 0.0) / span, 2)),
                context=context_rows(context, skip=frozenset({"traceback"})),
                traceback=traceback,
                outputs=outputs,
            )
        )
    return views, attempts


def _outputs(attempt: TaskAttempt, base: str, query: str = "") -> list[Output]:
    out = []
    for stream in STREAMS:
        size = getattr(attempt, f"{stream}_size") or 0
        if not size:
            continue
        head, tail = getattr(attempt, f"{stream}_head"), getattr(attempt, f"{stream}_tail")
        cut = size > 2 * OUTPUT_WINDOW
        if size <= OUTPUT_WINDOW:
            text = head
        elif not cut:  # the two windows overlap: join them without repeating the overlap
            text = head + tail[2 * OUTPUT_WINDOW - size :]
        else:
            text = head + "\n" + tail
        out.append(Output(stream, excerpt(text), size, f"{base}/{stream}.txt{query}", cut))
    return out


def choices(ti: TaskInstance, user: AbstractBaseUser | AnonymousUser, base_url: str, has_user_failure: bool) -> list[ActionChoice]:
    """The actions `user` may take on `ti` now, each with what it will do."""
    found = _choices(ti, user, base_url, has_user_failure)
    if ti.map_index < 0:
        return found
    return [ActionChoice(c.name, c.label, c.url, c.explanation, c.danger, c.downstream_option, ti.map_index) for c in found]


def _choices(ti: TaskInstance, user: AbstractBaseUser | AnonymousUser, base_url: str, has_user_failure: bool) -> list[ActionChoice]:
    if not user.has_perm(actions.ACT_PERMISSION):
        return []
    out = []
    state = ti.state
    downstream = actions.downstream_of(ti)
    waiting_downstream = [d.task_id for d in downstream if d.state == TaskState.UPSTREAM_FAILED]
    if state in CLEAR_FROM:
        retries = int(args_for(ti)["retries"])
        more = cleared_max_tries(ti.try_number, retries) - ti.try_number
        text = f"The task runs again with {more} more tr{'y' if more == 1 else 'ies'} (up to attempt {ti.try_number + more})"
        if waiting_downstream:
            text += f"; {', '.join(waiting_downstream)} (upstream_failed) will run after it"
        text += ". With downstream, every finished downstream task runs again too."
        text += " Its task state is emptied (a resumable task then starts a new remote job) unless you keep it."
        out.append(ActionChoice("clear", "Clear", f"{base_url}/clear", text, downstream_option=bool(downstream), task_state_option=True))
    if state in MARK_SUCCESS_FROM:
        text = "The task is recorded as succeeded without running"
        text += f"; {', '.join(waiting_downstream)} will run." if waiting_downstream else "; its downstream tasks may start."
        out.append(ActionChoice("mark_success", "Mark success", f"{base_url}/mark_success", text))
    if state in MARK_FAILED_FROM or state in ACTIVE_TASK_STATES:
        if state in ACTIVE_TASK_STATES:
            where = f" on {ti.worker_name}" if ti.worker_name else ""
            text = f"Stops the {state} task{where}: its process group gets SIGTERM, then SIGKILL after the kill grace; it is not retried."
        else:
            text = "The task is recorded as failed and not retried."
        pending = [d.task_id for d in downstream if d.state in (TaskState.NONE, TaskState.SCHEDULED)]
        if pending:
            text += f" Downstream tasks waiting on it ({', '.join(pending)}) may become upstream_failed."
        out.append(ActionChoice("mark_failed", "Mark failed", f"{base_url}/mark_failed", text, danger=True))
    if state not in ACTIVE_TASK_STATES and has_user_failure:
        used, limit = ti.infrastructure_try_number, ti.infrastructure_retry_limit
        text = (
            "Its last user-charged failure is charged to the platform instead: that try is given back and "
            f"repeats (attempt {ti.try_number} of {ti.max_tries} again), using platform retry {used + 1} of {limit}."
        )
        if state in (TaskState.FAILED, TaskState.DEAD_LETTER):
            text += " The task is scheduled again."
        out.append(ActionChoice("reclassify", "Reclassify as platform failure", f"{base_url}/reclassify", text))
    return out


# A value longer than this (as JSON) is shown folded: its first characters, the rest on demand.
FOLD_AT = 80


@dataclass(frozen=True)
class StateRow:
    key: str
    text: str  # the value as indented JSON
    preview: str  # its first characters, when folded
    folded: bool
    written_at: datetime
    attempt_number: int | None  # position among the attempts, for the link
    attempt_token: int
    by: str  # "user try 2, platform retry 1"


def task_state_rows(ti: TaskInstance, attempts: list[AttemptView]) -> list[StateRow]:
    """The task state's entries, each with when and by which attempt it was last written."""
    numbers = {a.attempt.attempt_token: a.number for a in attempts}
    rows = []
    for entry in taskstate.entries_of(ti.pk):
        compact = json.dumps(entry.value, ensure_ascii=False)
        folded = len(compact) > FOLD_AT
        by = f"user try {entry.try_number}" + (f", platform retry {entry.infrastructure_try_number}" if entry.infrastructure_try_number else "")
        rows.append(
            StateRow(
                key=entry.key,
                text=json.dumps(entry.value, ensure_ascii=False, indent=2) if folded else compact,
                preview=compact[:FOLD_AT] + "…" if folded else compact,
                folded=folded,
                written_at=entry.written_at,
                attempt_number=numbers.get(entry.attempt_token),
                attempt_token=entry.attempt_token,
                by=by,
            )
        )
    return rows


def dead_lettered_at(ti: TaskInstance) -> list[datetime]:
    """When an operator acted on the task while it was dead-lettered (from the audit log)."""
    rows = AuditLog.objects.filter(
        dag_id=ti.dag_run.dag.dag_id, run_id=ti.dag_run.run_id, task_id=ti.task_id, prior_state=TaskState.DEAD_LETTER
    )
    return list(rows.order_by("at").values_list("at", flat=True))


def context(ti: TaskInstance, user: AbstractBaseUser | AnonymousUser, *, action_error: str = "", notice: str = "") -> dict[str, Any]:
    now = timezone.now()
    run, dag = ti.dag_run, ti.dag_run.dag
    base_url = task_url(dag.dag_id, run.run_id, ti.task_id).rstrip("/")
    instance_query = f"?map_index={ti.map_index}" if ti.map_index >= 0 else ""
    attempts, rows = attempt_views(ti, base_url, now, instance_query)
    has_user_failure = any(a.attempt.kind == AttemptKind.USER and a.attempt.state == "failed" for a in attempts)
    last = ti.last_failure_context or {}
    facts = rootcause.facts_of(rows, stderr_tail=lambda a: getattr(a, "stderr_tail", "") or "")
    tipped = rootcause.tipping_tokens(facts, ti.state, dead_lettered_at(ti))
    for view, fact in zip(attempts, facts):
        view.poisoned = fact.token in tipped
        view.budget = rootcause.attempt_label(fact.previous_kind, fact.try_number, fact.infrastructure_try_number, ti.max_tries, ti.infrastructure_retry_limit)
        view.budget_kind = AttemptKind.PLATFORM if fact.previous_kind == AttemptKind.PLATFORM else AttemptKind.USER
        view.charged = rootcause.charged_to(fact.kind) if fact.state == "failed" and not rootcause.is_action(fact.context) else ""
    cause = rootcause.root_cause(facts, last, max_tries=ti.max_tries, infrastructure_retry_limit=ti.infrastructure_retry_limit, tipped=tipped)
    action = rootcause.operator_action(last)
    ran = rootcause.attempts_seconds(facts, now)
    return {
        "dag": dag,
        "run": run,
        "ti": ti,
        "finished": ti.state not in ACTIVE_TASK_STATES and ti.state not in (TaskState.NONE, TaskState.SCHEDULED, TaskState.UP_FOR_RETRY),
        "attempt_label": attempt_label(ti.try_number, ti.max_tries),
        "waiting": waiting_text(getattr(ti, "waiting_for", None)),
        "attempts": attempts,
        "task_state": task_state_rows(ti, attempts),
        # The task's own context when it is a failure (an operator's action is shown as one, below).
        "last_failure": [] if action else context_rows(last, skip=frozenset({"traceback"})),
        "root_cause": cause,
        "operator_action": action,
        # After a success the last failure is history, not the state.
        "last_failure_is_history": cause is not None and ti.state == TaskState.SUCCESS,
        "choices": choices(ti, user, base_url, has_user_failure),
        "fingerprint_url": reverse("web:fingerprint", args=[ti.failure_fingerprint]) if ti.failure_fingerprint else "",
        "action_error": action_error,
        "notice": notice,
        "duration": duration(ran) if ran is not None else "",
        "attempts_count": len(facts),
        "result": result_view(ti.result),
        # A mapped instance's item, as JSON (a long one clipped: the whole is in the task's spec or upstream result).
        "item": _clip(json.dumps(ti.map_item, ensure_ascii=False), 300) if ti.map_index >= 0 else None,
        "label": actions.label(ti),
        "instance_query": instance_query,
        "all_instances_url": base_url if ti.map_index >= 0 else "",
    }


def mapped_context(
    run: DagRun,
    task_id: str,
    user: AbstractBaseUser | AnonymousUser,
    state_filter: str = "",
    page: int = 1,
    *,
    action_error: str = "",
    notice: str = "",
) -> dict[str, Any] | None:
    """A mapped task's page: its instances' counts by state, one page of them with state, tries
    and last failure, filterable by state, and the actions on all of them or on the failed ones.
    None when the task is not mapped (or not expanded yet): it has one instance's page."""
    counts = mapped.state_counts(run, task_id)
    if not counts:
        return None
    dag = run.dag
    base_url = task_url(dag.dag_id, run.run_id, task_id).rstrip("/")
    overview = mapped.overview(run, task_id, counts, base_url, user, state_filter, page)
    query = {key: value for key, value in (("state", overview["state_filter"]), ("page", overview["page"].number)) if value and value != 1}
    return {
        "dag": dag,
        "run": run,
        "ti": TaskInstance.objects.filter(dag_run=run, task_id=task_id).only("id", "task_id", "map_index", "state").order_by("map_index").first(),
        "label": task_id,
        "mapped": overview,
        "finished": not (set(counts) & (set(ACTIVE_TASK_STATES) | {TaskState.NONE, TaskState.SCHEDULED, TaskState.UP_FOR_RETRY})),
        "action_error": action_error,
        "notice": notice,
        "instance_query": f"?{urlencode(query)}" if query else "",
    }


def same_failure(fingerprint: str, limit: int = 200) -> tuple[list[dict[str, Any]], int]:
    """Every task instance with an attempt that failed with `fingerprint`, newest first (capped)."""
    rows = (
        TaskAttempt.objects.filter(fingerprint=fingerprint, state=TaskAttempt.State.FAILED)
        .values("task_instance_id", "task_instance__dag_run__dag__dag_id", "task_instance__dag_run__run_id", "task_instance__task_id", "task_instance__state")
        .order_by("task_instance_id")
        .distinct()
    )
    found = list(rows.order_by("-task_instance_id")[: limit + 1])
    out = [
        {
            "dag_id": r["task_instance__dag_run__dag__dag_id"],
            "run_id": r["task_instance__dag_run__run_id"],
            "task_id": r["task_instance__task_id"],
            "state": r["task_instance__state"],
            "url": task_url(r["task_instance__dag_run__dag__dag_id"], r["task_instance__dag_run__run_id"], r["task_instance__task_id"]),
        }
        for r in found[:limit]
    ]
    return out, len(found)


def output_text(ti: TaskInstance, attempt_token: int, stream: str) -> str | None:
    """The whole stored text of one attempt's stream (None: no such attempt)."""
    if stream not in STREAMS:
        return None
    row = TaskAttempt.objects.filter(task_instance=ti, attempt_token=attempt_token).values_list(stream, flat=True).first()
    return row



def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
