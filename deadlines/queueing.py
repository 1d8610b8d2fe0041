"""Putting deadline callbacks on the worker queues (RQ), only after the claim has committed.

The database is the truth: a callback row says `queued` before its job exists. If Redis
loses the job (or the enqueue fails), the check's watchdog finds the row when its lease runs
out and dispatches it again, so Redis only delivers.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from rq import Queue

from deadlines.conf import setting
from orchestrator.foundation.redis_conn import get_redis

log = logging.getLogger(__name__)

CALLBACK_FUNCTION = "deadlines.callbacks.run_callback"
MISSED = "missed"
AT_RISK = "at_risk"
DEFAULT_QUEUE = "default"
# Keys of callback_kwargs that configure the call instead of being passed to the callback.
RESERVED_KWARGS = ("queue", "timeout")
# RQ's own bound sits above ours, for a callback that somehow outlives its thread's bound.
RQ_TIMEOUT_MARGIN = 30


@dataclass(frozen=True)
class CallbackJob:
    """One call of one deadline's callback: `token` tells a current job from a stale one."""

    deadline_id: int
    kind: str  # MISSED | AT_RISK
    token: int
    queue: str = DEFAULT_QUEUE
    timeout: float = 30.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        return job_id_for(self.deadline_id, self.kind, self.token)


def job_id_for(deadline_id: int, kind: str, token: int) -> str:
    return f"deadline-{deadline_id}-{kind}-{token}"


def callback_options(callback_kwargs: Mapping[str, Any]) -> tuple[str, float]:
    """The queue and the time bound of a deadline's callback (callback_kwargs `queue`, `timeout`)."""
    queue = callback_kwargs.get("queue") or DEFAULT_QUEUE
    timeout = callback_kwargs.get("timeout")
    try:
        bound = float(timeout) if timeout is not None else float(setting("ORCHESTRATOR_DEADLINE_CALLBACK_TIMEOUT"))
    except (TypeError, ValueError):
        bound = float(setting("ORCHESTRATOR_DEADLINE_CALLBACK_TIMEOUT"))
    return str(queue), max(bound, 0.001)


def job_for(deadline: Any, kind: str, token: int, **extra: Any) -> CallbackJob:
    queue, timeout = callback_options(deadline.callback_kwargs or {})
    return CallbackJob(deadline.pk, kind, token, queue=queue, timeout=timeout, extra=extra)


def enqueue(jobs: Iterable[CallbackJob]) -> int:
    """Enqueue now, one Redis round trip per queue; return how many jobs were enqueued."""
    by_queue: dict[str, list[CallbackJob]] = defaultdict(list)
    for job in jobs:
        by_queue[job.queue].append(job)
    enqueued = 0
    for name, batch in by_queue.items():
        try:
            queue = Queue(name, connection=get_redis())
            queue.enqueue_many(
                [
                    Queue.prepare_data(
                        CALLBACK_FUNCTION,
                        args=(job.deadline_id, job.kind, job.token),
                        kwargs=job.extra or None,
                        job_id=job.job_id,
                        timeout=int(job.timeout) + RQ_TIMEOUT_MARGIN,
                        result_ttl=3600,
                        failure_ttl=86400,
                        description=f"deadline {job.deadline_id} {job.kind} callback, dispatch {job.token}",
                    )
                    for job in batch
                ]
            )
            enqueued += len(batch)
        except Exception:
            log.exception("could not enqueue %d deadline callbacks on %r; the check dispatches them again", len(batch), name)
    return enqueued


def enqueue_on_commit(jobs: list[CallbackJob]) -> None:
    """Enqueue once the current transaction commits, so a job never sees an uncommitted claim."""
    if jobs:
        transaction.on_commit(lambda: enqueue(jobs))
