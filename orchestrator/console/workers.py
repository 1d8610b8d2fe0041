"""Live RQ workers and queues, with the attempts each worker is running.

Redis is read per worker and per queue (a handful of each); the database once, for the task
instances held by any of the workers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import cast

from django.utils import timezone
from redis import Redis
from rq import Queue, Worker
from rq.job import Job

from orchestrator.data import queue_listeners
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import TaskInstance
from orchestrator.worker.host.spool import set_aside_entries
from retries.states import ACTIVE_TASK_STATES


@dataclass(frozen=True)
class Running:
    dag_id: str
    run_id: str
    task_id: str
    state: str
    started: datetime | None


@dataclass
class WorkerRow:
    name: str
    hostname: str
    pid: int | None
    queues: list[str]
    concurrency: int
    task_user: str | None
    spool_error: str | None  # why its spool could not keep an outcome, the last time it could not
    state: str
    last_heartbeat: datetime | None
    running: list[Running] = field(default_factory=list)
    # How it enforces memory limits: "cgroup" or "watched" (None: a worker that does not say).
    memory_limits: str | None = None


@dataclass(frozen=True)
class QueueRow:
    name: str
    depth: int
    oldest_enqueued_at: datetime | None
    listeners: int

    @property
    def unattended(self) -> bool:
        """Work waiting and nobody listening: nothing will ever take it."""
        return self.depth > 0 and self.listeners == 0

    @property
    def oldest_age(self) -> timedelta | None:
        return timezone.now() - self.oldest_enqueued_at if self.oldest_enqueued_at else None


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and timezone.is_naive(value):
        return timezone.make_aware(value, dt_timezone.utc)
    return value


def _field(redis: Redis, name: str, key: str) -> str | None:
    """A field the worker wrote on its RQ record, as text; None when absent or empty."""
    raw = cast("bytes | None", redis.hget(f"rq:worker:{name}", key))  # the client's types cover its async twin too
    return raw.decode(errors="replace") or None if raw else None


def _concurrency(redis: Redis, name: str) -> int:
    raw = _field(redis, name, "concurrency")
    try:
        return max(1, int(raw)) if raw is not None else 1
    except ValueError:
        return 1


def _spool_error(redis: Redis, name: str) -> str | None:
    return _field(redis, name, "spool_error")


def _task_user(redis: Redis, name: str) -> str | None:
    """The user the worker runs its tasks as; None: its own user."""
    return _field(redis, name, "task_user")


def _memory_limits(redis: Redis, name: str) -> str | None:
    """How the worker enforces tasks' memory limits: "cgroup" or "watched"."""
    return _field(redis, name, "memory_limits")


def workers() -> list[WorkerRow]:
    redis = get_redis()
    rows = [
        WorkerRow(
            name=w.name,
            hostname=(w.hostname.decode() if isinstance(w.hostname, bytes) else w.hostname) or "",
            pid=w.pid,
            queues=w.queue_names(),
            concurrency=_concurrency(redis, w.name),
            task_user=_task_user(redis, w.name),
            spool_error=_spool_error(redis, w.name),
            memory_limits=_memory_limits(redis, w.name),
            state=str(w.get_state()),
            last_heartbeat=_aware(w.last_heartbeat),
        )
        for w in Worker.all(connection=redis)
        # RQ's record of a worker outlives it by minutes: a worker killed is gone from the list
        # once its heartbeat is older than a live worker's can be.
        if queue_listeners.is_live_now(_aware(w.last_heartbeat))
    ]
    by_name = {row.name: row for row in rows}
    held = (
        TaskInstance.objects.filter(state__in=ACTIVE_TASK_STATES, worker_name__in=list(by_name))
        .values_list("worker_name", "dag_run__dag__dag_id", "dag_run__run_id", "task_id", "state", "start_date")
        .order_by("start_date", "id")
    )
    for worker_name, dag_id, run_id, task_id, state, started in held:
        by_name[worker_name].running.append(Running(dag_id, run_id, task_id, state, started))
    return sorted(rows, key=lambda r: r.name)


def queues(worker_rows: list[WorkerRow]) -> list[QueueRow]:
    redis = get_redis()
    listening: dict[str, int] = {}
    for row in worker_rows:
        for name in row.queues:
            listening[name] = listening.get(name, 0) + 1
    found = {q.name: q for q in Queue.all(connection=redis)}
    for name in listening:  # a queue someone listens on but that holds nothing yet
        found.setdefault(name, Queue(name, connection=redis))
    rows = []
    for name, queue in sorted(found.items()):
        oldest = None
        first = queue.get_job_ids(0, 1)
        if first:
            job = Job.fetch(first[0], connection=redis) if redis.exists(f"rq:job:{first[0]}") else None
            oldest = _aware(job.enqueued_at) if job else None
        rows.append(QueueRow(name=name, depth=queue.count, oldest_enqueued_at=oldest, listeners=listening.get(name, 0)))
    return rows


@dataclass(frozen=True)
class SetAside:
    """A spooled report no database would take, set aside by its worker."""

    worker_name: str
    file: str
    reason: str
    task_instance_id: int | None
    token: int | None
    at: datetime | None


def set_aside() -> list[SetAside]:
    """The newest reports workers set aside, newest first."""
    rows = []
    for entry in set_aside_entries():
        at = entry.get("at")
        rows.append(
            SetAside(
                worker_name=str(entry.get("worker_name") or ""),
                file=str(entry.get("file") or ""),
                reason=str(entry.get("reason") or ""),
                task_instance_id=entry.get("task_instance_id"),
                token=entry.get("token"),
                at=datetime.fromtimestamp(at, dt_timezone.utc) if isinstance(at, (int, float)) else None,
            )
        )
    return rows


def document(row: WorkerRow) -> dict:
    """A worker as /api/v1/workers serves it."""
    return {
        "name": row.name,
        "hostname": row.hostname,
        "pid": row.pid,
        "queues": row.queues,
        "concurrency": row.concurrency,
        "task_user": row.task_user,
        "spool_error": row.spool_error,
        "memory_limits": row.memory_limits,
        "state": row.state,
        "last_heartbeat": row.last_heartbeat.isoformat() if row.last_heartbeat else None,
        "running": [{"dag_id": r.dag_id, "run_id": r.run_id, "task_id": r.task_id} for r in row.running],
    }
