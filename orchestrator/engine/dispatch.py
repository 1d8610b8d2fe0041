"""Handing a task instance to the workers: a new attempt token, an attempt row, an RQ job."""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from rq import Queue

from deadlines import lifecycle
from orchestrator.engine.transitions import transition
from orchestrator.models import TaskAttempt, TaskInstance, job_id_for
from orchestrator.redis_conn import get_redis
from retries.states import DISPATCH_FROM, AttemptKind, TaskState

log = logging.getLogger(__name__)

JOB_FUNCTION = "orchestrator.worker.job.run_task_instance"


def dispatch(ti: TaskInstance, now: datetime) -> bool:
    """Queue `ti` for a worker if it is still as read; return whether this caller won.

    A user try adds one to try_number; a platform retry repeats the current try. The update
    expects exactly the state that was read (a clear racing this dispatch moves the task to
    `none`, and then this dispatch loses).
    """
    if ti.state not in DISPATCH_FROM:
        return False
    # What the task was, should Redis refuse the job: then this dispatch never happened.
    before = {
        "state": ti.state,
        "try_number": ti.try_number,
        "retry_is_platform": ti.retry_is_platform,
        "pre_execution_tries": ti.pre_execution_tries,
        "queued_at": ti.queued_at,
    }
    user_try = not ti.retry_is_platform
    token = ti.attempt_token + 1
    try_number = ti.try_number + 1 if user_try else ti.try_number
    with transaction.atomic():
        won = transition(
            ti.pk,
            expected=[ti.state],
            token=ti.attempt_token,
            state=TaskState.QUEUED,
            attempt_token=token,
            try_number=try_number,
            pre_execution_tries=0 if user_try else ti.pre_execution_tries,
            retry_is_platform=False,
            queued_at=now,
            next_retry_at=None,
            waiting_for=None,
            release_at=None,
            heartbeat_at=None,
            hostname="",
            worker_name="",
            pid=None,
        )
        if not won:
            return False
        TaskAttempt.objects.create(
            task_instance_id=ti.pk,
            attempt_token=token,
            try_number=try_number,
            infrastructure_try_number=ti.infrastructure_try_number,
            kind=AttemptKind.USER,
            state=TaskAttempt.State.QUEUED,
            queued_at=now,
        )
        ti.state, ti.attempt_token, ti.try_number, ti.queued_at = TaskState.QUEUED, token, try_number, now
        lifecycle.task_queued(ti, now)
        queue_name, ti_id = ti.queue, ti.pk
        transaction.on_commit(lambda: enqueue(queue_name, ti_id, token, undo=before))
    return True


def enqueue(queue_name: str, task_instance_id: int, token: int, *, undo: dict[str, Any] | None = None) -> bool:
    """Put the job on Redis. If Redis cannot take it, the dispatch is undone (`undo` holds what
    the task was): the task waits, charged nothing, for a scheduler pass to dispatch it again.
    A job lost later, once in Redis, is found by the scheduler as queue_lost: the database is
    the truth, Redis only delivers."""
    try:
        Queue(queue_name, connection=get_redis()).enqueue_call(
            func=JOB_FUNCTION,
            args=(task_instance_id, token),
            job_id=job_id_for(task_instance_id, token),
            timeout=-1,  # the supervisor enforces execution_timeout, not RQ
            result_ttl=600,
            failure_ttl=86400,
            description=f"task instance {task_instance_id} attempt {token}",
        )
    except Exception as exc:
        log.warning("could not enqueue task instance %s attempt %s (%s); it waits for the next dispatch", task_instance_id, token, exc)
        if undo is not None:
            _undo_dispatch(task_instance_id, token, undo)
        return False
    return True


def _undo_dispatch(task_instance_id: int, token: int, before: dict[str, Any]) -> None:
    """The job never reached a queue: put the task back as it was, minus its attempt row.

    Fenced by the new token and `queued`, so it changes nothing if anything moved the task on.
    The token stays spent: a job with it can never exist."""
    try:
        with transaction.atomic():
            if transition(task_instance_id, expected=[TaskState.QUEUED], token=token, heartbeat_at=None, **before):
                TaskAttempt.objects.filter(
                    task_instance_id=task_instance_id, attempt_token=token, state=TaskAttempt.State.QUEUED
                ).delete()
    except Exception:
        log.exception("could not undo the dispatch of task instance %s attempt %s; the scheduler will find it", task_instance_id, token)
