"""One attempt as the run page and the task page show it: why it failed, which budget it was and
which paid for it, whether it poisoned its task. Both pages build it here, from the same facts
(`rootcause.facts_of`), so they never tell one attempt two ways."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from orchestrator.console import rootcause
from orchestrator.console.text import Excerpt, Row, context_rows
from orchestrator.models import AuditLog, DagRun, TaskAttempt, TaskInstance
from retries.states import AttemptKind, TaskState

# The context's own keys; the rest of its rows are its metadata.
CONTEXT_KEYS = ("category", "reason", "source")


@dataclass(frozen=True)
class Output:
    stream: str
    excerpt: Excerpt
    size: int
    url: str
    cut_in_database: bool  # the stored text is longer than the two windows read
    full: FullOutput | None = None  # what the output store has of it (None: no store)


@dataclass(frozen=True)
class FullOutput:
    """The stream as the output store keeps it (up to its cap), or why it is not there."""

    url: str
    size: int | None  # bytes kept; None: the store does not have it
    pending: bool  # the attempt has not ended: the store has it once it does

    @property
    def missing_because(self) -> str:
        if self.pending:
            return "the full output is in the output store once the attempt ends"
        return (
            "the output store does not have the full output: removed by the retention, kept on another "
            "machine's disk, or it could not be written (the worker's log says so)"
        )


@dataclass
class AttemptView:
    attempt: TaskAttempt
    number: int  # 1-based position among the task's attempts
    category: str
    reason: str
    source: str
    context: list[Row]
    traceback: str  # '' when the attempt's output already holds it: it is shown once
    budget: str  # what it was: "user try 2 of 3" / "platform retry 1 of 5"
    budget_kind: str  # user / platform: which of the two it was
    charged: str  # which budget paid for its failure ('' unless it failed)
    poisoned: bool  # this attempt dead-lettered the task
    # The task page's timeline and output excerpts.
    duration: str = ""
    offset_percent: float = 0.0
    width_percent: float = 0.0
    outputs: list[Output] = field(default_factory=list)
    # A mapped instance's attempt: the item it ran with, as JSON (a long one clipped); else None.
    item: str | None = None

    @property
    def metadata(self) -> list[Row]:
        """The context's rows past its category, reason and source (shown beside them)."""
        return [row for row in self.context if row.key not in CONTEXT_KEYS]

    @property
    def has_full_output(self) -> bool:
        """The output store has at least one of its streams."""
        return any(o.full is not None and o.full.size is not None for o in self.outputs)

    @property
    def resume_label(self) -> str:
        """What a resumable task decided on this attempt, in words ("" for other tasks)."""
        return (self.attempt.resume or "").replace("_", " ")


def attempt_view(attempt: TaskAttempt, fact: rootcause.AttemptFacts, ti: TaskInstance, tipped: set[int], *, output: str) -> AttemptView:
    """`fact` is the attempt's (`rootcause.facts_of`), `tipped` the tokens that poisoned the task
    (`rootcause.tipping_tokens`), `output` the text of its output the page shows."""
    context = attempt.context or {}
    traceback = str((context.get("metadata") or {}).get("traceback") or "")
    if traceback and traceback.strip()[-200:] in output:
        traceback = ""
    return AttemptView(
        attempt=attempt,
        number=fact.number,
        category=context.get("category", ""),
        reason=context.get("reason", ""),
        source=context.get("source", ""),
        context=context_rows(context, skip=frozenset({"traceback"})),
        traceback=traceback,
        budget=rootcause.attempt_label(fact.previous_kind, fact.try_number, fact.infrastructure_try_number, ti.max_tries, ti.infrastructure_retry_limit),
        budget_kind=AttemptKind.PLATFORM if fact.previous_kind == AttemptKind.PLATFORM else AttemptKind.USER,
        charged=rootcause.charged_to(fact.kind) if fact.state == TaskAttempt.State.FAILED and not rootcause.is_action(fact.context) else "",
        poisoned=fact.token in tipped,
        item=item_text(attempt.item) if ti.map_index >= 0 or attempt.item is not None else None,
    )


ITEM_SHOWN = 300  # characters of an attempt's item a page shows (the run document has it whole)


def item_text(item: object) -> str:
    """An item as JSON, clipped to ITEM_SHOWN characters."""
    text = json.dumps(item, ensure_ascii=False)
    return text if len(text) <= ITEM_SHOWN else text[: ITEM_SHOWN - 1] + "…"


def dead_lettered_at(run: DagRun, task_id: str | None = None) -> dict[str, list[datetime]]:
    """When an operator acted on each of the run's tasks (or on `task_id`) while it was
    dead-lettered, from the audit log, oldest first: what `rootcause.tipping_tokens` needs."""
    rows = AuditLog.objects.filter(dag_id=run.dag.dag_id, run_id=run.run_id, prior_state=TaskState.DEAD_LETTER)
    if task_id is not None:
        rows = rows.filter(task_id=task_id)
    found: dict[str, list[datetime]] = {}
    for task, at in rows.order_by("at").values_list("task_id", "at"):
        found.setdefault(task, []).append(at)
    return found
