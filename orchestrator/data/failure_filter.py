"""Which failed attempts a failures filter matches: one rule for `GET /api/v1/failures` and the
failures page.

A reason matches an attempt's own reason, or, for a task that is dead-lettered, the task's: a
poisoned task's attempts keep their own reason (`task_exception`), while the task reads
`poisoned`, so `reason=poisoned` finds the failures that dead-lettered it.
"""
from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from orchestrator.models import TaskAttempt
from retries.states import TaskState


def failed_attempts(
    *,
    category: str = "",
    reason: str = "",
    dag_id: str = "",
    task_id: str = "",
    host: str = "",
    fingerprint: str = "",
    owner: str = "",
    since: datetime | None = None,
) -> QuerySet[TaskAttempt]:
    """The failed attempts that match every filter given (an empty one matches all), unordered."""
    rows = TaskAttempt.objects.filter(state=TaskAttempt.State.FAILED)
    if since is not None:
        rows = rows.filter(end_date__gte=since)
    if category:
        rows = rows.filter(context__category=category)
    if reason:
        task_reason = Q(task_instance__state=TaskState.DEAD_LETTER, task_instance__last_failure_context__reason=reason)
        rows = rows.filter(Q(context__reason=reason) | task_reason)
    if dag_id:
        rows = rows.filter(task_instance__dag_run__dag__dag_id=dag_id)
    if task_id:
        rows = rows.filter(task_instance__task_id=task_id)
    if owner:
        rows = rows.filter(task_instance__dag_run__dag__owner=owner)
    if host:
        rows = rows.filter(hostname=host)
    if fingerprint:
        rows = rows.filter(fingerprint=fingerprint)
    return rows
