"""Which queues a live worker reads. A task queued on any other queue waits for nobody: it stays
`queued`, and its run document, its pages and `trigger_dag --wait` say so.

A worker counts as live while its RQ heartbeat (beaten every ORCHESTRATOR_HEARTBEAT_INTERVAL by
its heartbeat thread, busy or idle) is at most LIVE_BEATS intervals old: a queue whose last
worker died is seen unattended within two intervals of its death. RQ's own record of a worker
outlives it by minutes (its key's time to live), so that record alone is not enough.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.conf import settings

log = logging.getLogger(__name__)

LIVE_BEATS = 1.5


def is_live(last_heartbeat: datetime | None, now: datetime, interval: float) -> bool:
    """Whether a worker whose last RQ heartbeat was at `last_heartbeat` is still alive."""
    if last_heartbeat is None:
        return False
    if last_heartbeat.tzinfo is None:
        last_heartbeat = last_heartbeat.replace(tzinfo=dt_timezone.utc)
    return now - last_heartbeat <= timedelta(seconds=LIVE_BEATS * interval)


def listened(workers: Iterable[tuple[datetime | None, Iterable[str]]], now: datetime, interval: float) -> set[str]:
    """The queues read by the live ones of (last heartbeat, queue names) workers."""
    return {queue for last_heartbeat, queues in workers if is_live(last_heartbeat, now, interval) for queue in queues}


def listened_queues(now: datetime | None = None) -> set[str] | None:
    """The queues some live worker reads now; None when Redis cannot say (nothing is flagged then)."""
    from rq import Worker

    from orchestrator.redis_conn import get_redis

    now = now or datetime.now(dt_timezone.utc)
    try:
        workers = [(w.last_heartbeat, w.queue_names()) for w in Worker.all(connection=get_redis())]
    except Exception:  # an unreachable Redis must not break a page: it only cannot tell
        log.warning("could not read the live workers from Redis", exc_info=True)
        return None
    return listened(workers, now, float(settings.ORCHESTRATOR_HEARTBEAT_INTERVAL))


def unattended_wait(queue: str, queued_at: datetime | None, listened: set[str] | None) -> dict | None:
    """`waiting_for` of a task queued (and not yet taken) on `queue`: the queue when no live
    worker reads it, else None."""
    if listened is None or queue in listened:
        return None
    return {"kind": "queue", "name": queue, "since": queued_at.isoformat() if queued_at else None}
