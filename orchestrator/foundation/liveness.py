"""Whether this machine's scheduler or worker is alive, from the heartbeat it records in Redis.

What a container's liveness and readiness probes run (`manage.py check_alive scheduler|worker`):

- a worker's heartbeat thread refreshes its RQ worker record (`last_heartbeat`, with its
  `hostname`) every ORCHESTRATOR_HEARTBEAT_INTERVAL, the same thread that keeps its attempts'
  leases; a worker whose record is older than ORCHESTRATOR_HEARTBEAT_TIMEOUT has already had
  its running tasks presumed lost by the scheduler, so restarting it loses nothing more;
- the scheduler records one beat per pass (`record_scheduler_beat`), under its host name.

A host name is a pod's own name on Kubernetes, so each pod checks only its own process. The
clocks compared are the same machine's. Redis being out of reach is reported as "cannot tell",
not as dead: restarting a process does not bring Redis back, and a worker keeps its running tasks
through an outage of the database (see docs/architecture.md).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import cast

import redis
from rq.utils import utcparse
from rq.worker_registration import REDIS_WORKER_KEYS

SCHEDULER_KEY = "orchestrator:alive:scheduler:{hostname}"
# A scheduler's beat outlives it by this long in Redis, so a probe tells "stale" from "never seen".
SCHEDULER_BEAT_TTL = 3600


@dataclass(frozen=True)
class Verdict:
    alive: bool | None  # None: cannot tell (Redis out of reach)
    message: str


def record_scheduler_beat(client: redis.Redis, *, hostname: str | None = None, now: float | None = None) -> None:
    """One beat of this host's scheduler; raises redis.RedisError when Redis cannot take it."""
    hostname = hostname or socket.gethostname()
    now = time.time() if now is None else now
    client.set(SCHEDULER_KEY.format(hostname=hostname), f"{os.getpid()} {now:.3f}", ex=SCHEDULER_BEAT_TTL)


def judge(beats: list[tuple[str, float]], *, what: str, hostname: str, max_age: float, now: float) -> Verdict:
    """Alive when the newest of this host's beats (name, unix time) is at most `max_age` old."""
    if not beats:
        return Verdict(False, f"no {what} of host {hostname} has recorded a heartbeat")
    name, newest = max(beats, key=lambda beat: beat[1])
    age = now - newest
    if age > max_age:
        return Verdict(False, f"{what} {name}: last heartbeat {age:.0f}s ago (more than {max_age:g}s)")
    return Verdict(True, f"{what} {name}: last heartbeat {max(age, 0.0):.1f}s ago")


def scheduler_beats(client: redis.Redis, hostname: str) -> list[tuple[str, float]]:
    raw = cast("bytes | None", client.get(SCHEDULER_KEY.format(hostname=hostname)))  # redis-py types a reply as maybe-awaitable, for its async client too
    if raw is None:
        return []
    pid, _, at = raw.decode().partition(" ")
    return [(f"{hostname}.{pid}", float(at))]


def worker_beats(client: redis.Redis, hostname: str) -> list[tuple[str, float]]:
    """The RQ workers registered from this host, with their last heartbeat."""
    members = cast("set[bytes]", client.smembers(REDIS_WORKER_KEYS))  # redis-py types a reply as maybe-awaitable, for its async client too
    keys = sorted(k.decode() for k in members)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, ["hostname", "last_heartbeat"])
    beats = []
    for key, (host, last) in zip(keys, pipe.execute()):
        if host is not None and last is not None and host.decode() == hostname:
            beats.append((key.rsplit(":", 1)[-1], utcparse(last.decode()).timestamp()))
    return beats


def check(client: redis.Redis, what: str, *, max_age: float, hostname: str | None = None, now: float | None = None) -> Verdict:
    hostname = hostname or socket.gethostname()
    read = {"scheduler": scheduler_beats, "worker": worker_beats}[what]
    try:
        beats = read(client, hostname)
    except redis.RedisError as exc:
        return Verdict(None, f"cannot tell whether the {what} is alive: Redis is out of reach ({exc.__class__.__name__})")
    now = datetime.now(timezone.utc).timestamp() if now is None else now
    return judge(beats, what=what, hostname=hostname, max_age=max_age, now=now)
