"""Queues paused by an infrastructure storm (the rule is `retries.storms.paused`).

Dispatch holds the tasks of a paused queue (`waiting_for` kind "queue", nothing charged) and
/metrics reports it. The count is read at most once a second per process: a storm is measured
in tens of seconds, and dispatch is the hot path.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count

from orchestrator.models import TaskAttempt
from retries import storms

CACHE_SECONDS = 1.0

_lock = threading.Lock()
_cache: tuple[float, set[str]] | None = None


def paused_queues(now: datetime) -> set[str]:
    global _cache
    threshold = int(settings.ORCHESTRATOR_QUEUE_STORM_THRESHOLD)
    if threshold <= 0:
        return set()
    cached = _cache
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    counts = storm_failures(now)
    result = storms.paused(counts, threshold)
    with _lock:
        _cache = (time.monotonic(), result)
    return result


def storm_failures(now: datetime) -> dict[str, int]:
    """Storm failures per queue that ended within the window (index attempt_failed_end)."""
    since = now - timedelta(seconds=float(settings.ORCHESTRATOR_QUEUE_STORM_WINDOW))
    rows = (
        TaskAttempt.objects.filter(state=TaskAttempt.State.FAILED, end_date__gte=since, context__reason__in=[r.value for r in storms.STORM_REASONS])
        .values("task_instance__queue")
        .annotate(n=Count("id"))
    )
    return {row["task_instance__queue"]: row["n"] for row in rows}


def forget() -> None:
    """Read again on the next call (tests)."""
    global _cache
    with _lock:
        _cache = None
