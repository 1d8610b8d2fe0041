"""The one function that changes a task instance's state.

Every change is a conditional update on the expected prior state and the attempt token, so a
late or duplicate report (an old worker presumed lost, a second scheduler) changes nothing.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from orchestrator.models import TaskInstance
from retries.states import TaskState


def transition(
    task_instance_id: int,
    *,
    expected: Iterable[TaskState | str],
    token: int | None = None,
    **changes: Any,
) -> bool:
    """Apply `changes` if the task is in one of `expected` (and holds `token`); return whether it won."""
    rows = TaskInstance.objects.filter(pk=task_instance_id, state__in=[str(s) for s in expected])
    if token is not None:
        rows = rows.filter(attempt_token=token)
    changes.setdefault("updated_at", timezone.now())
    return rows.update(**changes) == 1
