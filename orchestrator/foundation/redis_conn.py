"""The Redis connection every process shares (REDIS_URL).

Every wait on Redis is bounded: a server that stops answering (packets dropped, not refused)
raises a timeout within seconds instead of holding a thread, TCP keepalives find a dead peer on
an idle connection, and a connection idle for a while is checked before it is used again.
"""
from __future__ import annotations

import socket

import redis
from django.conf import settings

_clients: dict[tuple[str, float], redis.Redis] = {}

SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 3.0
HEALTH_CHECK_INTERVAL = 15


def keepalive_options() -> dict[int, int]:
    """Probe an idle connection after 5 s, every 2 s, give up after 3 unanswered probes."""
    options = {}
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    return options


def client_for(url: str, socket_timeout: float = SOCKET_TIMEOUT, **kwargs) -> redis.Redis:
    """A new client of `url` whose every wait is bounded (connect, read, idle peer)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(CONNECT_TIMEOUT, socket_timeout),
        socket_keepalive=True,
        socket_keepalive_options=keepalive_options(),
        health_check_interval=HEALTH_CHECK_INTERVAL,
        **kwargs,
    )


def get_redis(socket_timeout: float = SOCKET_TIMEOUT) -> redis.Redis:
    """The shared client; a caller that must not wait long (the heartbeat) asks for a shorter
    `socket_timeout` and gets a client of its own."""
    url = settings.REDIS_URL
    key = (url, float(socket_timeout))
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = client_for(url, socket_timeout)
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
