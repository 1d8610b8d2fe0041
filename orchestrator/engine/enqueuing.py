"""Work on its way: jobs committed as queued but not yet in their queue, and runs whose due
tasks are still being dispatched chunk by chunk.

A dispatch commits first and enqueues its jobs after (a job must never see uncommitted rows);
putting thousands of jobs on Redis takes seconds, longer than a short queued timeout. While a
batch is being enqueued a marker names it in Redis (its queue and the time its tasks were
queued), and the scheduler does not take a job it cannot find yet for lost. A dispatcher that
dies mid-batch leaves the marker to expire: its jobs are found lost a little later, never early.

A wide run's due tasks past its first chunk are dispatched after that commit, a chunk per
transaction (`run_advance.dispatch_later`); meanwhile a marker names the run, and the scheduler's pass
leaves it to its dispatcher instead of reading the whole run and racing it for the same tasks
(each would still go once: the fences decide). The marker is refreshed with each chunk; a
dispatcher that dies leaves it to expire, and the next pass after that dispatches the rest.
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
    return {batch for batch, exists in zip(batches, _exist(redis, [marker(*batch) for batch in batches])) if exists}


# How long a run's dispatch marker outlives its last chunk (a chunk takes well under a second).
RUN_MARKER_SECONDS = 10


def run_marker(run_id: int) -> str:
    return f"orchestrator:dispatching:run:{run_id}"


def dispatching(redis: Redis, run_id: int) -> None:
    """A dispatcher is on the run's next chunk (set, or refreshed, before each)."""
    redis.set(run_marker(run_id), 1, ex=RUN_MARKER_SECONDS)


def dispatched(redis: Redis, run_id: int) -> None:
    """The dispatcher is done with the run (every chunk, or it gave up)."""
    redis.delete(run_marker(run_id))


def being_dispatched(redis: Redis, run_ids: Iterable[int]) -> set[int]:
    """Which of these runs a dispatcher is still putting on their way."""
    run_ids = sorted(set(run_ids))
    return {run_id for run_id, exists in zip(run_ids, _exist(redis, [run_marker(run_id) for run_id in run_ids])) if exists}


def _exist(redis: Redis, keys: list[str]) -> list[bool]:
    """Whether each of these keys is set, in one round trip (none for no keys)."""
    if not keys:
        return []
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.exists(key)
    return [bool(exists) for exists in pipe.execute()]
