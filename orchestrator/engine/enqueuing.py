"""Jobs on their way to Redis: committed as queued in the database, not yet in their queue.

A dispatch commits first and enqueues its jobs after (a job must never see uncommitted rows);
putting thousands of jobs on Redis takes seconds, longer than a short queued timeout. While a
batch is being enqueued a marker names it in Redis (its queue and the time its tasks were
queued), and the scheduler does not take a job it cannot find yet for lost. A dispatcher that
dies mid-batch leaves the marker to expire: its jobs are found lost a little later, never early.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from redis import Redis
from redis.client import Pipeline

# How long a marker outlives a dispatcher that died before removing it.
MARKER_SECONDS = 60


def marker(queue: str, queued_at: datetime) -> str:
    return f"orchestrator:enqueuing:{queue}:{round(queued_at.timestamp() * 1_000_000)}"


def begin(redis: Redis, batches: Iterable[tuple[str, datetime]]) -> list[str]:
    keys = sorted({marker(queue, queued_at) for queue, queued_at in batches})
    if keys:
        pipe = redis.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, 1, ex=MARKER_SECONDS)
        pipe.execute()
    return keys


def end(redis: Redis | Pipeline, keys: list[str]) -> None:
    """The batches are in their queues (or, in a pipeline, will be with the jobs it holds)."""
    if keys:
        redis.delete(*keys)


def on_their_way(redis: Redis, batches: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
    """Which of these (queue, queued_at) batches are still being enqueued."""
    batches = sorted(set(batches))
    if not batches:
        return set()
    pipe = redis.pipeline(transaction=False)
    for queue, queued_at in batches:
        pipe.exists(marker(queue, queued_at))
    return {batch for batch, exists in zip(batches, pipe.execute()) if exists}
