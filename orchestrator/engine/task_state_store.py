"""The task state in the database: read when an attempt starts, written fenced by its token.

`apply()` is the only writer of `TaskStateEntry` rows apart from a clear (`empty()`): a change
is stored only while the writing attempt is the task instance's current, running one, so an
attempt that was superseded (its worker presumed lost, its task retried elsewhere) can never
overwrite its successor's checkpoint.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from orchestrator.data import metrics
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.task_state import too_many_keys
from orchestrator.models import TaskAttempt, TaskInstance, TaskStateEntry
from retries.states import TaskState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """What an attempt's task needs of its state: the entries and its idempotency key."""

    entries: dict[str, Any]
    idempotency_key: str


def idempotency_key(task_instance_id: int, dag_id: str, run_id: str, task_id: str, epoch: int) -> str:
    """Stable for a task instance across all its attempts; a clear that empties the task state
    gives a new one (`epoch`). Hex, so any job service accepts it as a name."""
    text = "\x1f".join((dag_id, run_id, task_id, str(task_instance_id), str(epoch)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def start(task_instance_id: int, dag_id: str, run_id: str, task_id: str) -> Start:
    """The task state and idempotency key an attempt starts with (one read)."""
    rows = TaskInstance.objects.filter(pk=task_instance_id).values_list("task_state_epoch", "state_entries__key", "state_entries__value")
    found = list(rows)
    epoch = found[0][0] if found else 0
    entries = {key: value for _, key, value in found if key is not None}
    return Start(entries=entries, idempotency_key=idempotency_key(task_instance_id, dag_id, run_id, task_id, epoch))


def start_claimed(task_instance_id: int, dag_id: str, run_id: str, task_id: str, epoch: int, has_entries: bool) -> Start | None:
    """The start of a claimed attempt without a read, when its claim saw no task state stored
    (most tasks): None when there are entries to read (`start`)."""
    if has_entries:
        return None
    return Start(entries={}, idempotency_key=idempotency_key(task_instance_id, dag_id, run_id, task_id, epoch))


def apply(
    task_instance_id: int, token: int, changes: Iterable[dict[str, Any]], *, now: datetime | None = None, max_keys: int | None = None
) -> bool:
    """Store changes (in order) made by the attempt `token`; False, changing nothing, when that
    attempt is no longer the current running one.

    Each change is {"op": "set" | "delete" | "resume", "key", "value"}, already validated.
    Applying the same list twice leaves the same store, so a delivery retried after a lost
    answer is harmless. A set of a new key when the store holds `max_keys` keys
    (ORCHESTRATOR_TASK_STATE_MAX_KEYS) raises ValueError naming the limit, and none of the
    changes is stored (the worker answers the task `invalid`).
    """
    changes = list(changes)
    now = now or shared_now()
    max_keys = int(settings.ORCHESTRATOR_TASK_STATE_MAX_KEYS) if max_keys is None else max_keys
    decisions = []
    with transaction.atomic():
        # The row lock orders this against a dispatch that would supersede the attempt.
        current = (
            TaskInstance.objects.select_for_update()
            .filter(pk=task_instance_id, attempt_token=token, state=TaskState.RUNNING)
            .values_list("try_number", "infrastructure_try_number")
            .first()
        )
        if current is None:
            return False
        try_number, infrastructure_try_number = current
        for change in changes:
            op, key = change["op"], change.get("key", "")
            if op == "set":
                written = {
                    "value": change.get("value"),
                    "written_at": now,
                    "attempt_token": token,
                    "try_number": try_number,
                    "infrastructure_try_number": infrastructure_try_number,
                }
                if not TaskStateEntry.objects.filter(task_instance_id=task_instance_id, key=key).update(**written):
                    # A new key: counted only then (the task instance's row lock orders writers).
                    held = TaskStateEntry.objects.filter(task_instance_id=task_instance_id).count()
                    if held >= max_keys:
                        raise too_many_keys(key, held, max_keys)  # rolls back the changes before it
                    TaskStateEntry.objects.create(task_instance_id=task_instance_id, key=key, **written)
            elif op == "delete":
                TaskStateEntry.objects.filter(task_instance_id=task_instance_id, key=key).delete()
            elif op == "resume":
                updated = TaskAttempt.objects.filter(task_instance_id=task_instance_id, attempt_token=token, resume__isnull=True).update(
                    resume=change["value"]
                )
                if updated:
                    decisions.append(change["value"])
    for decision in decisions:
        metrics.increment(metrics.RESUME_DECISIONS, decision=decision)
    return True


def empty(task_instance_ids: Iterable[int]) -> None:
    """A clear that does not keep the task state: the store is emptied and the idempotency key
    changes, so a resumable task starts a new remote job. Call inside the clear's transaction."""
    ids = list(task_instance_ids)
    TaskStateEntry.objects.filter(task_instance_id__in=ids).delete()
    from django.db.models import F

    TaskInstance.objects.filter(pk__in=ids).update(task_state_epoch=F("task_state_epoch") + 1)


def of_instances(task_instance_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Each task instance's store as the run document serves it: key → value."""
    stores: dict[int, dict[str, Any]] = {}
    rows = TaskStateEntry.objects.filter(task_instance_id__in=list(task_instance_ids)).values_list("task_instance_id", "key", "value")
    for ti_id, key, value in rows.order_by("task_instance_id", "key"):
        stores.setdefault(ti_id, {})[key] = value
    return stores


def entries_of(task_instance_id: int, offset: int = 0, limit: int | None = None) -> list[TaskStateEntry]:
    """One task instance's entries with who wrote them, by key, `limit` from `offset` (the task
    page's page of them)."""
    rows = TaskStateEntry.objects.filter(task_instance_id=task_instance_id).order_by("key")
    return list(rows[offset : None if limit is None else offset + limit])


def count_of(task_instance_id: int) -> int:
    """How many keys one task instance's store holds."""
    return TaskStateEntry.objects.filter(task_instance_id=task_instance_id).count()
