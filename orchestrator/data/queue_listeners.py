"""Which queues a live worker reads. A task queued on any other queue waits for nobody: it stays
`queued`, and its run document, its pages and `trigger_dag --wait` say so.

A worker counts as live while its RQ heartbeat (beaten every ORCHESTRATOR_HEARTBEAT_INTERVAL by
its heartbeat thread, busy or idle) is at most LIVE_BEATS intervals old: a queue whose last
worker died is seen unattended within two intervals of its death. RQ's own record of a worker
outlives it by minutes (its key's time to live), so that record alone is not enough.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

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


def is_live_now(last_heartbeat: datetime | None) -> bool:
    """`is_live` now, by this deployment's heartbeat interval."""
    return is_live(last_heartbeat, datetime.now(dt_timezone.utc), float(settings.ORCHESTRATOR_HEARTBEAT_INTERVAL))


def live_count(redis: Any) -> int:
    """How many of the workers RQ has a record of are live."""
    return sum(1 for last_heartbeat, _queues in _workers(redis) if is_live_now(last_heartbeat))


def listened(workers: Iterable[tuple[datetime | None, Iterable[str]]], now: datetime, interval: float) -> set[str]:
    """The queues read by the live ones of (last heartbeat, queue names) workers."""
    return {queue for last_heartbeat, queues in workers if is_live(last_heartbeat, now, interval) for queue in queues}


def reuse_for(interval: float) -> float:
    """How long one answer of Redis is reused: at most a second, and short enough that a queue
    whose last worker died is still seen unattended within two intervals of its death (liveness
    itself takes LIVE_BEATS of them)."""
    return min(MAX_REUSE, (2 - LIVE_BEATS) * interval)


MAX_REUSE = 1.0
# (monotonic time it was read, the answer): every run document with a queued task asks, and a
# client polling runs would otherwise pay a Redis round trip (reading every worker) each time.
_last_answer: tuple[float, set[str] | None] = (-math.inf, None)


def forget() -> None:
    """Ask Redis again on the next call (tests)."""
    global _last_answer
    _last_answer = (-math.inf, None)


def listened_queues(now: datetime | None = None) -> set[str] | None:
    """The queues some live worker reads now; None when Redis cannot say (nothing is flagged then).
    An answer is reused for `reuse_for` the heartbeat interval, unless `now` is given."""
    global _last_answer
    interval = float(settings.ORCHESTRATOR_HEARTBEAT_INTERVAL)
    if now is not None:
        return _read_listened(now, interval)
    read_at, answer = _last_answer
    if time.monotonic() - read_at < reuse_for(interval):
        return answer
    answer = _read_listened(datetime.now(dt_timezone.utc), interval)
    _last_answer = (time.monotonic(), answer)
    return answer


def _read_listened(now: datetime, interval: float) -> set[str] | None:
    from orchestrator.foundation.redis_conn import get_redis

    try:
        workers = _workers(get_redis())
    except Exception:  # an unreachable Redis must not break a page: it only cannot tell
        log.warning("could not read the live workers from Redis", exc_info=True)
        return None
    return listened(workers, now, interval)


def _workers(redis: Any) -> list[tuple[datetime | None, list[str]]]:
    """(last heartbeat, queue names) of every worker RQ has registered, from the fields of its
    record RQ's `Worker.refresh` reads them from, in two round trips: RQ's `Worker.all` takes
    two per worker (a run's document asks while its task is queued)."""
    from rq.utils import utcparse
    from rq.worker_registration import get_keys

    keys = sorted(get_keys(connection=redis))
    if not keys:
        return []
    with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hmget(key, "last_heartbeat", "queues")
        records = pipe.execute()
    workers = []
    for heartbeat, queues in records:
        if heartbeat is None and queues is None:
            continue  # its record expired: RQ's Worker.all leaves it out too
        heartbeat, queues = (value.decode() if isinstance(value, bytes) else value for value in (heartbeat, queues))
        workers.append((utcparse(heartbeat) if heartbeat else None, queues.split(",") if queues else []))
    return workers


def unattended_wait(queue: str, queued_at: datetime | None, listened: set[str] | None) -> dict | None:
    """`waiting_for` of a task queued (and not yet taken) on `queue`: the queue when no live
    worker reads it, else None."""
    if listened is None or queue in listened:
        return None
    return {"kind": "queue", "name": queue, "since": queued_at.isoformat() if queued_at else None}
