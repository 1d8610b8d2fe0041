"""The task's own last failure, kept in view after an operator acts, and the action beside it.

An operator's clear, mark failed or mark success replaces the task's `last_failure_context`
with a `user_action` context. That context says what the operator did, not why the task
failed: the why is still in the task's attempts. These pure functions read both, so the pages
can show the root cause (category, reason, error line, the attempt it came from, whether the
task was poisoned) and the operator's action as an action (who, when, the note).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from orchestrator.console.text import error_summary, seconds_between
from retries.budget import platform_retry_label
from retries.states import AttemptKind, Category, Reason, TaskState

FAILED = "failed"

ACTION_WORDS = {
    Reason.MANUAL_CLEAR.value: "cleared",
    Reason.MANUAL_MARK_SUCCESS.value: "marked success",
    Reason.MANUAL_MARK_FAILED.value: "marked failed",
    Reason.MANUAL_RECLASSIFY.value: "reclassified as the platform's failure",
}


@dataclass(frozen=True)
class AttemptFacts:
    """What the root cause needs of one physical attempt (a TaskAttempt, read either way)."""

    token: int
    number: int  # 1-based position among the task's attempts
    kind: str
    state: str
    try_number: int
    infrastructure_try_number: int
    context: dict[str, Any]
    start: datetime | None
    end: datetime | None
    stderr_tail: str
    previous_kind: str = ""  # the kind of the attempt before it: a platform one makes this a platform retry


@dataclass(frozen=True)
class RootCause:
    category: str
    reason: str
    error: str
    attempt_token: int | None  # None: known from the task's context only (no failed attempt)
    attempt_number: int | None
    budget: str  # what the attempt was: "user try 2 of 3" / "platform retry 1 of 5"
    charged: str  # which budget paid for its failure: "the platform" / "its retries"
    poisoned: bool
    at: datetime | None


@dataclass(frozen=True)
class OperatorAction:
    reason: str
    words: str  # "marked failed"
    user: str
    note: str
    prior_state: str
    at: datetime | None


def attempt_label(previous_kind: str, try_number: int, infrastructure_try_number: int, max_tries: int, infrastructure_retry_limit: int) -> str:
    """What an attempt was, one numbering for every page: a try of the task's own
    ("user try 2 of 3") or, after a failure the platform paid for, a platform retry that repeats
    that try ("platform retry 1 of 5")."""
    if previous_kind == AttemptKind.PLATFORM:
        return platform_retry_label(infrastructure_try_number, infrastructure_retry_limit)
    return f"user try {try_number} of {max_tries}"


def spent_label(kind: str, try_number: int, infrastructure_try_number: int, max_tries: int, infrastructure_retry_limit: int) -> str:
    """The unit of budget a failed attempt used up, in the same numbering: its own user try, or
    the next platform retry (an attempt's `kind` says which budget paid for its failure)."""
    if kind == AttemptKind.PLATFORM:
        return platform_retry_label(infrastructure_try_number + 1, infrastructure_retry_limit)
    return f"user try {try_number} of {max_tries}"


def charged_to(kind: str) -> str:
    return "the platform" if kind == AttemptKind.PLATFORM else "its retries"


def is_action(context: dict[str, Any] | None) -> bool:
    return context is not None and context.get("category") == Category.USER_ACTION


def operator_action(task_context: dict[str, Any] | None) -> OperatorAction | None:
    """The operator's last action on the task, when its context is one."""
    if not is_action(task_context):
        return None
    assert task_context is not None
    metadata = task_context.get("metadata") or {}
    reason = str(task_context.get("reason", ""))
    at = task_context.get("at")
    return OperatorAction(
        reason=reason,
        words=ACTION_WORDS.get(reason, reason.replace("_", " ")),
        user=str(metadata.get("user") or ""),
        note=str(metadata.get("note") or ""),
        prior_state=str(metadata.get("prior_state") or ""),
        at=parse_datetime(at) if isinstance(at, str) else None,
    )


def tipping_tokens(attempts: Sequence[AttemptFacts], task_state: str, dead_lettered_at: Iterable[datetime]) -> set[int]:
    """The attempts that dead-lettered the task (the poisoned badge belongs on them only).

    The task is dead-lettered now: its last failed attempt tipped it. It was before an
    operator acted (an audit row whose prior state is dead_letter, at `dead_lettered_at`): the
    last failed attempt that ended before that action did.
    """
    failed = [a for a in attempts if a.state == FAILED and not is_action(a.context)]
    tokens = set()
    if task_state == TaskState.DEAD_LETTER and failed:
        tokens.add(failed[-1].token)
    for at in dead_lettered_at:
        before = [a for a in failed if a.end is not None and a.end <= at]
        if before:
            tokens.add(before[-1].token)
    return tokens


def root_cause(
    attempts: Sequence[AttemptFacts],
    task_context: dict[str, Any] | None,
    *,
    max_tries: int,
    infrastructure_retry_limit: int,
    tipped: set[int],
) -> RootCause | None:
    """The task's own last failure: its last failed attempt that an operator did not end, else
    its context when that is a failure without an attempt (e.g. a job lost before it ran)."""
    failed = [a for a in attempts if a.state == FAILED and not is_action(a.context)]
    if failed:
        last = failed[-1]
        context = last.context or {}
        return RootCause(
            category=str(context.get("category", "")),
            reason=str(context.get("reason", "")),
            error=error_summary(context, last.stderr_tail),
            attempt_token=last.token,
            attempt_number=last.number,
            budget=attempt_label(last.previous_kind, last.try_number, last.infrastructure_try_number, max_tries, infrastructure_retry_limit),
            charged=charged_to(last.kind),
            poisoned=last.token in tipped,
            at=last.end,
        )
    if task_context and not is_action(task_context):
        at = task_context.get("at")
        return RootCause(
            category=str(task_context.get("category", "")),
            reason=str(task_context.get("reason", "")),
            error=error_summary(task_context),
            attempt_token=None,
            attempt_number=None,
            budget="",
            charged="",
            poisoned=task_context.get("reason") == Reason.POISONED,
            at=parse_datetime(at) if isinstance(at, str) else None,
        )
    return None


def attempts_seconds(attempts: Sequence[AttemptFacts], now: datetime) -> float | None:
    """How long the task's attempts ran, added up (not the time between an operator's actions)."""
    total, any_started = 0.0, False
    for a in attempts:
        end = a.end or (now if a.state == "running" else None)
        secs = seconds_between(a.start, end)
        if secs is not None:
            total += max(secs, 0.0)
            any_started = True
    return total if any_started else None


def facts_of(attempts: Sequence[Any], stderr_tail: Any = None) -> list[AttemptFacts]:
    """AttemptFacts of TaskAttempt rows in attempt order; `stderr_tail(attempt)` reads the end of
    its stderr (default: the row's own stderr)."""
    read = stderr_tail or (lambda a: (a.stderr or "")[-2000:])
    ordered = sorted(attempts, key=lambda a: a.attempt_token)
    return [
        AttemptFacts(
            token=a.attempt_token,
            number=number,
            kind=a.kind,
            state=a.state,
            try_number=a.try_number,
            infrastructure_try_number=a.infrastructure_try_number,
            context=a.context or {},
            start=a.start_date,
            end=a.end_date,
            stderr_tail=read(a),
            previous_kind=ordered[number - 2].kind if number > 1 else "",
        )
        for number, a in enumerate(ordered, start=1)
    ]
