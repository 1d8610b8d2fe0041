"""The task instance page: every physical attempt to scale, why each failed, its output, and
what each operator action would do, spelled out before anyone confirms it.

Queries: the attempts (output cut to its head and tail in the database), the run's task
instances (for the downstream tasks an action touches) and one count of the task instances
that failed with the same fingerprint, and the task state's entries; none grows with the history.
Which actions the task allows comes from the view (`choices.Operator`), not from here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, BinaryIO
from urllib.parse import urlencode

from django.db.models import F, Func, QuerySet
from django.db.models.functions import Left, Length, Right
from django.urls import reverse
from django.utils import timezone

from orchestrator.console import mapped, rootcause
from orchestrator.console.attempts import AttemptView, FullOutput, Output, attempt_view, dead_lettered_at
from orchestrator.console.choices import ActionChoice, Operator, choice
from orchestrator.console.grid import waiting_words
from orchestrator.console.paging import Span, page_count
from orchestrator.console.text import attempt_label, context_rows, duration, excerpt, seconds_between
from orchestrator.data.queue_listeners import listened_queues
from orchestrator.engine import task_state_store
from orchestrator.foundation.outputstore import OutputStore, output_store
from orchestrator.models import DagRun, TaskAttempt, TaskInstance, TaskStateEntry
from orchestrator.operations.documents import waiting_for
from retries.states import IN_FLIGHT_TASK_STATES, TaskState

# Bytes of each stream read from the database for the excerpt; the whole text is one link away.
OUTPUT_WINDOW = 16_000
STREAMS = ("stdout", "stderr")


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


def attempt_views(ti: TaskInstance, base_url: str, now: datetime, query: str = "") -> tuple[list[AttemptView], list[rootcause.AttemptFacts], set[int]]:
    """The task's attempts on a timeline, each with its output's excerpts; their facts, and the
    tokens of those that poisoned the task."""
    windows: dict[str, Func] = {}
    for stream in STREAMS:
        windows[f"{stream}_head"] = Left(stream, OUTPUT_WINDOW)
        windows[f"{stream}_tail"] = Right(stream, OUTPUT_WINDOW)
        windows[f"{stream}_size"] = Length(stream)
    attempts = list(_attempts_shown(ti).defer(*STREAMS).annotate(**windows))
    facts = rootcause.facts_of(attempts, stderr_tail=lambda a: getattr(a, "stderr_tail", "") or "")
    tipped = rootcause.tipping_tokens(facts, ti.state, dead_lettered_at(ti.dag_run, ti.task_id).get(ti.task_id, []))
    starts = [a.start_date or a.queued_at for a in attempts]
    ends = [a.end_date or (now if a.state in ("queued", "running") else (a.start_date or a.queued_at)) for a in attempts]
    first = min(starts, default=now)
    span = max((seconds_between(first, max(ends, default=now)) or 0.0), 0.001)
    views = []
    store = output_store()
    for attempt, fact, start, end in zip(attempts, facts, starts, ends):
        # A parked former instance's attempt (see _attempts_shown) is found under its own index.
        own = query if attempt.task_instance_id == ti.pk else f"?map_index={attempt.instance_map_index}"  # type: ignore[attr-defined]  # annotated
        outputs = _outputs(attempt, f"{base_url}/attempts/{attempt.attempt_token}", own, store)
        view = attempt_view(attempt, fact, ti, tipped, output="".join(o.excerpt.head + o.excerpt.tail for o in outputs))
        secs = seconds_between(attempt.start_date, attempt.end_date or (now if attempt.state == "running" else None))
        view.duration = duration(secs) if secs is not None else ("did not start" if attempt.state == "failed" else "")
        view.offset_percent = round(100 * (seconds_between(first, start) or 0.0) / span, 2)
        view.width_percent = max(0.6, round(100 * (seconds_between(start, end) or 0.0) / span, 2))
        view.outputs = outputs
        views.append(view)
    return views, facts, tipped


def _attempts_shown(ti: TaskInstance) -> QuerySet[TaskAttempt]:
    """The task's attempts, oldest first; for a mapped task made unexpanded again (its
    placeholder), with those of its former instances parked meanwhile (below -1)."""
    attempts = TaskAttempt.objects.annotate(instance_map_index=F("task_instance__map_index"))
    if ti.map_index != -1 or not TaskInstance.objects.filter(dag_run_id=ti.dag_run_id, task_id=ti.task_id, map_index__lt=-1).exists():
        return attempts.filter(task_instance=ti).order_by("attempt_token")
    return attempts.filter(
        task_instance__dag_run_id=ti.dag_run_id, task_instance__task_id=ti.task_id, task_instance__map_index__lte=-1
    ).order_by("queued_at", "id")


def _outputs(attempt: TaskAttempt, base: str, query: str = "", store: OutputStore | None = None) -> list[Output]:
    out = []
    ended = attempt.state not in (TaskAttempt.State.QUEUED, TaskAttempt.State.RUNNING)
    for stream in STREAMS:
        full = None
        if store is not None and store.enabled:
            kept = store.size((attempt.task_instance_id, attempt.attempt_token), stream)
            full = FullOutput(f"{base}/{stream}.log{query}", kept, pending=kept is None and not ended)
        size = getattr(attempt, f"{stream}_size") or 0
        # A report whose text the database refused keeps none: the store may still have it.
        if not size and (full is None or full.size is None):
            continue
        head, tail = getattr(attempt, f"{stream}_head") or "", getattr(attempt, f"{stream}_tail") or ""
        cut = size > 2 * OUTPUT_WINDOW
        if size <= OUTPUT_WINDOW:
            text = head
        elif not cut:  # the two windows overlap: join them without repeating the overlap
            text = head + tail[2 * OUTPUT_WINDOW - size :]
        else:
            text = head + "\n" + tail
        out.append(Output(stream, excerpt(text), size, f"{base}/{stream}.txt{query}", cut, full))
    return out


def choices(ti: TaskInstance, operator: Operator, base_url: str) -> list[ActionChoice]:
    """The actions the operator may take on `ti` now, each with what it will do."""
    allowed = operator.allowed([ti]).get(ti.pk, ())
    if not allowed:
        return []
    downstream = operator.downstream(ti)
    return [choice(name, f"{base_url}/{name}", ti, downstream) for name in allowed]


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


# The task page shows a task state this many keys at a time (a store may hold
# ORCHESTRATOR_TASK_STATE_MAX_KEYS of them).
STATE_KEYS_PER_PAGE = 100


def task_state_page(ti: TaskInstance, attempts: list[AttemptView], page: int = 1) -> tuple[list[StateRow], Span]:
    """Page `page` (clamped) of the task state's entries, by key, and where it sits among them all."""
    total = task_state_store.count_of(ti.pk)
    page = min(max(1, page), page_count(total, STATE_KEYS_PER_PAGE))
    entries = task_state_store.entries_of(ti.pk, (page - 1) * STATE_KEYS_PER_PAGE, STATE_KEYS_PER_PAGE) if total else []
    rows = task_state_rows(entries, attempts)
    return rows, Span.of(page, STATE_KEYS_PER_PAGE, total, len(rows))


def task_state_rows(entries: list[TaskStateEntry], attempts: list[AttemptView]) -> list[StateRow]:
    """Task state entries, each with when and by which attempt it was last written."""
    numbers = {a.attempt.attempt_token: a.number for a in attempts}
    rows = []
    for entry in entries:
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


def context(ti: TaskInstance, operator: Operator, *, action_error: str = "", notice: str = "", state_page: int = 1) -> dict[str, Any]:
    now = timezone.now()
    run, dag = ti.dag_run, ti.dag_run.dag
    base_url = task_url(dag.dag_id, run.run_id, ti.task_id).rstrip("/")
    instance_query = f"?map_index={ti.map_index}" if ti.map_index >= 0 else ""
    attempts, facts, tipped = attempt_views(ti, base_url, now, instance_query)
    last = ti.last_failure_context or {}
    cause = rootcause.root_cause(facts, last, max_tries=ti.max_tries, infrastructure_retry_limit=ti.infrastructure_retry_limit, tipped=tipped)
    action = rootcause.operator_action(last)
    ran = rootcause.attempts_seconds(facts, now)
    state_rows, state_span = task_state_page(ti, attempts, state_page)
    return {
        "dag": dag,
        "run": run,
        "ti": ti,
        "finished": _settled(ti.state),
        "attempt_label": attempt_label(ti.try_number, ti.max_tries),
        "waiting": waiting_words(waiting_for(ti, listened_queues() if ti.state == TaskState.QUEUED else None), ti.state),
        "attempts": attempts,
        "task_state": state_rows,
        "task_state_span": state_span,
        # The task's own context when it is a failure (an operator's action is shown as one, below).
        "last_failure": [] if action else context_rows(last, skip=frozenset({"traceback"})),
        "root_cause": cause,
        "operator_action": action,
        # After a success the last failure is history, not the state.
        "last_failure_is_history": cause is not None and ti.state == TaskState.SUCCESS,
        "choices": choices(ti, operator, base_url),
        "fingerprint_url": reverse("web:fingerprint", args=[ti.failure_fingerprint]) if ti.failure_fingerprint else "",
        "action_error": action_error,
        "notice": notice,
        "duration": duration(ran) if ran is not None else "",
        "attempts_count": len(facts),
        "result": result_view(ti.result),
        # A mapped instance's item, as JSON (a long one clipped: the whole is in the task's spec or upstream result).
        "item": _clip(json.dumps(ti.map_item, ensure_ascii=False), 300) if ti.map_index >= 0 else None,
        "label": ti.label,
        "instance_query": instance_query,
        "all_instances_url": base_url if ti.map_index >= 0 else "",
    }


def _settled(state: str) -> bool:
    """Whether a task in `state` will not move by itself (finished or dead-lettered): its page stops polling."""
    return state not in IN_FLIGHT_TASK_STATES and state != TaskState.NONE


def mapped_context(
    run: DagRun,
    task_id: str,
    operator: Operator,
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
    overview = mapped.overview(run, task_id, counts, base_url, operator, state_filter, page)
    query = {key: value for key, value in (("state", overview["state_filter"]), ("page", overview["page"].number)) if value and value != 1}
    return {
        "dag": dag,
        "run": run,
        "ti": TaskInstance.objects.filter(dag_run=run, task_id=task_id, map_index__gte=-1).only("id", "task_id", "map_index", "state").order_by("map_index").first(),
        "label": task_id,
        "mapped": overview,
        "finished": all(_settled(state) for state in counts),
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


def output_file(ti: TaskInstance, attempt_token: int, stream: str) -> BinaryIO | None:
    """The output store's file of one attempt's stream, open for reading (None: no such
    attempt, or the store does not have it)."""
    if stream not in STREAMS or not TaskAttempt.objects.filter(task_instance=ti, attempt_token=attempt_token).exists():
        return None
    return output_store().open_reader((ti.pk, attempt_token), stream)


def output_text(ti: TaskInstance, attempt_token: int, stream: str) -> str | None:
    """The whole stored text of one attempt's stream (None: no such attempt)."""
    if stream not in STREAMS:
        return None
    row = TaskAttempt.objects.filter(task_instance=ti, attempt_token=attempt_token).values_list(stream, flat=True).first()
    return row



def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
