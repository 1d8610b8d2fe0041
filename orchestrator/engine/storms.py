"""Queues paused by an infrastructure storm (the rule is `retries.storms.paused`).

Dispatch holds the tasks of a paused queue (`waiting_for` kind "queue", nothing charged) and
/metrics reports it. The count is read at most once a second per process: a storm is measured
in tens of seconds, and dispatch is the hot path.
"""
from __future__ import annotations

import functools
import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from orchestrator.data import sql
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
    """Storm failures per queue that ended within the window (index attempt_failed_end).
    Written SQL, prepared on PostgreSQL: the ORM took longer to build it than the database to
    answer, and a web process answering a request now and then reads it for most of them."""
    since = now - timedelta(seconds=float(settings.ORCHESTRATOR_QUEUE_STORM_WINDOW))
    rows = sql.fetch(_storm_failures_sql(connection.vendor), [connection.ops.adapt_datetimefield_value(since)], [None, None], prepare=True)
    return {queue: count for queue, count in rows}


@functools.lru_cache(maxsize=2)
def _storm_failures_sql(vendor: str) -> str:
    reason = "a.context ->> 'reason'" if vendor == "postgresql" else "json_extract(a.context, '$.reason')"
    return (
        # The queue as text: its column's type (a varchar's length) may change, not the statement's result's.
        "SELECT CAST(ti.queue AS text), COUNT(*) FROM orchestrator_taskattempt a JOIN orchestrator_taskinstance ti ON ti.id = a.task_instance_id"
        f" WHERE a.state = '{TaskAttempt.State.FAILED}' AND a.end_date >= %s"
        f" AND {reason} IN ({sql.literals(r.value for r in storms.STORM_REASONS)}) GROUP BY ti.queue"
    )


def forget() -> None:
    """Read again on the next call (tests)."""
    global _cache
    with _lock:
        _cache = None
