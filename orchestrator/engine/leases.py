"""Attempt leases kept in Redis while the metadata database is out of reach.

A worker that cannot write its heartbeats to the database, but can reach Redis, renews one key
per attempt it holds (`SET ... EX heartbeat_timeout`). The scheduler presumes a running task
lost only when its database heartbeat is stale AND no such key exists, so a database outage
does not turn every running task into `worker_lost`. A worker cut off from both renews nothing:
its own lease runs out first and it stops its tasks before any key can expire.
"""
from __future__ import annotations

from collections.abc import Iterable

import redis

KEY = "orchestrator:lease:{task_instance_id}:{token}"
# Why an attempt's outcome was lost by its worker (it could neither deliver nor spool it): read by
# the scheduler when it presumes the attempt lost, for the failure's metadata.
LOST_KEY = "orchestrator:outcome-lost:{task_instance_id}:{token}"
LOST_NOTE_SECONDS = 86400


def _key(task_instance_id: int, token: int) -> str:
    return KEY.format(task_instance_id=task_instance_id, token=token)


def renew(client: redis.Redis, attempts: Iterable[tuple[int, int]], ttl: float, holder: str) -> None:
    """Keep these attempts' leases for `ttl` seconds more; raises if Redis cannot take them."""
    pipe = client.pipeline(transaction=False)
    for task_instance_id, token in attempts:
        pipe.set(_key(task_instance_id, token), holder, px=max(1, int(ttl * 1000)))
    pipe.execute()


def held(client: redis.Redis, attempts: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """The attempts whose lease key is alive; raises if Redis cannot be read."""
    if not attempts:
        return set()
    pipe = client.pipeline(transaction=False)
    for task_instance_id, token in attempts:
        pipe.exists(_key(task_instance_id, token))
    return {attempt for attempt, alive in zip(attempts, pipe.execute()) if alive}


def note_lost(client: redis.Redis, task_instance_id: int, token: int, why: str) -> None:
    """Say why this attempt's outcome is lost; raises if Redis cannot take it."""
    client.set(LOST_KEY.format(task_instance_id=task_instance_id, token=token), why[:1000], ex=LOST_NOTE_SECONDS)


def lost_notes(client: redis.Redis, attempts: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """Why the outcomes of these attempts were lost, for those a worker said so of."""
    if not attempts:
        return {}
    pipe = client.pipeline(transaction=False)
    for task_instance_id, token in attempts:
        pipe.get(LOST_KEY.format(task_instance_id=task_instance_id, token=token))
    found = {}
    for attempt, raw in zip(attempts, pipe.execute()):
        if raw is not None:
            found[attempt] = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return found
