"""Handing a task instance to the workers: a new attempt token, an attempt row, an RQ job."""
from __future__ import annotations

import logging
from datetime import datetime

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
        transaction.on_commit(lambda: enqueue(queue_name, ti_id, token))
    return True


def enqueue(queue_name: str, task_instance_id: int, token: int) -> None:
    """Put the job on Redis. If this fails the task stays queued in the database and the
    scheduler requeues it as queue_lost: the database is the truth, Redis only delivers."""
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
    except Exception:
        log.exception("could not enqueue task instance %s attempt %s; the scheduler will requeue it", task_instance_id, token)
