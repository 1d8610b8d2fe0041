"""The Redis connection every process shares (REDIS_URL)."""
from __future__ import annotations

import redis
from django.conf import settings

_clients: dict[str, redis.Redis] = {}


def get_redis() -> redis.Redis:
    url = settings.REDIS_URL
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)
    return client


def job_statuses(job_ids: list[str]) -> list[str | None]:
    """RQ's status of each job (`queued`, `started`, `finished`, `failed`, ...), None when Redis
    has no such job; one pipeline for all of them."""
    if not job_ids:
        return []
    pipe = get_redis().pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(f"rq:job:{job_id}", "status")
    return [s.decode() if isinstance(s, bytes) else s for s in pipe.execute()]
