"""Handing task instances to the workers: a new attempt token, an attempt row, an RQ job.

A run's ready tasks are dispatched together (`dispatch_many`): one fenced UPDATE for all of
them, one INSERT of their attempt rows (on PostgreSQL in the same statement) and, once the
transaction commits, one Redis pipeline for their jobs. A fan-out of hundreds of tasks costs a handful of statements, not hundreds.
"""
from __future__ import annotations

import functools
import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from rq import Queue

from deadlines import lifecycle
from orchestrator.data import sql
from orchestrator.engine import enqueuing, handover
from orchestrator.engine.transitions import CHUNK, fence_params, fenced, transition
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import TaskAttempt, TaskInstance, job_id_for
from retries.states import DISPATCH_FROM, AttemptKind, TaskState

log = logging.getLogger(__name__)

JOB_FUNCTION = "orchestrator.worker.host.job.run_task_instance"
# One statement dispatches many task instances, each fenced by the (attempt token, state) it
# was read with (`fenced`). A user try adds one to try_number; a platform retry repeats the current try
# (and keeps counting its pre-execution failures). Portable: PostgreSQL and SQLite (3.35+).
_DISPATCH_SQL = """
UPDATE orchestrator_taskinstance SET
    state = %s,
    attempt_token = attempt_token + 1,
    try_number = CASE WHEN retry_is_platform THEN try_number ELSE try_number + 1 END,
    pre_execution_tries = CASE WHEN retry_is_platform THEN pre_execution_tries ELSE 0 END,
    retry_is_platform = %s,
    queued_at = %s,
    updated_at = %s,
    next_retry_at = NULL,
    waiting_for = NULL,
    release_at = NULL,
    heartbeat_at = NULL,
    hostname = '',
    worker_name = '',
    pid = NULL
WHERE {fence}
RETURNING id, attempt_token, try_number, infrastructure_try_number, {queued_deadlines} AS queued_deadlines, map_item
"""
# What the dispatch reads back of each task it won (a mapped instance's item only goes into its
# attempt row: on PostgreSQL within the statement, so it is not sent back).
_DISPATCHED = "id, attempt_token, try_number, infrastructure_try_number, queued_deadlines"


@dataclass(frozen=True)
class QueuedJob:
    """A dispatch whose job goes to Redis once its transaction commits; `undo` is what the
    task was, should Redis refuse the job (then the dispatch never happened)."""

    queue: str
    task_instance_id: int
    token: int
    undo: dict[str, Any] | None = None
    queued_at: datetime | None = None  # the dispatch's time: names its batch while it is enqueued
    task_instance: TaskInstance | None = None  # the dispatcher's row: put back with the task, should the job not go


def dispatch(ti: TaskInstance, now: datetime) -> bool:
    """Queue `ti` for a worker if it is still as read; return whether this caller won."""
    return dispatch_many([ti], now) == 1


def dispatch_many(tis: Sequence[TaskInstance], now: datetime, *, unwritten: frozenset[int] = frozenset()) -> int:
    """Queue every one of `tis` that is still as read; return how many this caller won.

    The update expects exactly the state and token that were read (a clear racing this
    dispatch moves the task to `none` with a new token, and then this dispatch loses). Each
    winner's in-memory row is updated to what was written. The tasks in `unwritten` were made
    ready in this transaction without writing it: they are expected in `none`, and move from
    there to `queued` (a chain's next task is written once).
    """
    candidates = [ti for ti in tis if ti.state in DISPATCH_FROM]
    if not candidates:
        return 0
    won = 0
    with transaction.atomic(savepoint=False):
        for start in range(0, len(candidates), CHUNK):
            won += _dispatch_chunk(candidates[start : start + CHUNK], now, unwritten)
    return won


def _dispatch_chunk(tis: list[TaskInstance], now: datetime, unwritten: frozenset[int] = frozenset()) -> int:
    by_pk = {ti.pk: ti for ti in tis}
    before = {ti.pk: _before(ti) for ti in tis}
    params: list[Any] = [str(TaskState.QUEUED), False, _db_datetime(now), _db_datetime(timezone.now())]
    params += fence_params((ti.pk, ti.attempt_token, TaskState.NONE if ti.pk in unwritten else ti.state) for ti in tis)
    # Whether each task has task_queued_at deadlines to create, read by the same statement.
    queued_deadlines, deadline_params = lifecycle.queued_deadlines_exist_sql("orchestrator_taskinstance")
    params += deadline_params
    statement = _DISPATCH_SQL.format(fence=fenced(len(tis)), queued_deadlines=queued_deadlines)
    with_attempts = connection.vendor == "postgresql"
    if with_attempts:  # the attempt rows in the same statement, from what the UPDATE returns
        insert, insert_params = _attempts_insert(now)
        statement = f"WITH dispatched AS ({statement}), inserted AS ({insert}) SELECT {_DISPATCHED} FROM dispatched"
        params += insert_params
    # Prepared on PostgreSQL, where its text is the same for any number of tasks (three arrays):
    # planning it took the server longer than running it for a chain's one task.
    with sql.cursor(prepare=True) as cursor:
        cursor.execute(statement, params)
        returned = cursor.fetchall()
    if not returned:
        return 0
    attempts, jobs, queued, with_deadlines = [], [], [], []
    for pk, token, try_number, infrastructure_try_number, has_queued_deadlines, *item in returned:
        ti = by_pk[pk]
        ti.state, ti.attempt_token, ti.try_number, ti.queued_at = TaskState.QUEUED, token, try_number, now
        ti.retry_is_platform, ti.next_retry_at, ti.waiting_for = False, None, None
        queued.append(ti)
        attempts.append(_new_attempt(pk, token, try_number, infrastructure_try_number, now, _item(item)))
        jobs.append(QueuedJob(ti.queue, pk, token, undo=before[pk], queued_at=now, task_instance=ti))
        if has_queued_deadlines:
            with_deadlines.append(ti)
    if not with_attempts:
        TaskAttempt.objects.bulk_create(attempts)
    for ti in with_deadlines:
        lifecycle.task_queued(ti, now)
    handed = _hand_over(queued)
    jobs = [job for job in jobs if job.task_instance_id != handed]
    if jobs:
        transaction.on_commit(lambda: enqueue_all(jobs))
    return len(returned)


def _hand_over(queued: list[TaskInstance]) -> int | None:
    """The task of `queued` the report being made in this thread takes for its own slot, claimed
    in this transaction (`handover`): no job goes to Redis for it. None when there is no offer,
    or it takes none of these."""
    offer = handover.wanted()
    chosen = offer.choose(queued) if offer is not None else None
    if offer is None or chosen is None or not offer.claim_now(chosen.pk, chosen.attempt_token):
        return None
    return chosen.pk


def _new_attempt(
    task_instance_id: int, token: int, try_number: int, infrastructure_try_number: int, now: datetime, item: Any = None
) -> TaskAttempt:
    """A dispatched attempt's row, as it starts: queued, a user's try (a platform retry is
    classified when it ends), with the item a mapped instance runs with (its task's `map_item`
    at dispatch, so the attempt keeps it when the task expands again over another list)."""
    return TaskAttempt(
        task_instance_id=task_instance_id,
        attempt_token=token,
        try_number=try_number,
        infrastructure_try_number=infrastructure_try_number,
        kind=AttemptKind.USER,
        state=TaskAttempt.State.QUEUED,
        queued_at=now,
        item=item,
    )


def _item(returned: list[Any]) -> Any:
    """The `map_item` a dispatch read back (SQLite only; PostgreSQL writes it in the statement)
    as its JSON value."""
    if not returned or returned[0] is None:
        return None
    return json.loads(returned[0]) if isinstance(returned[0], (str, bytes)) else returned[0]


# The columns of a new attempt that come from its task's dispatch (the `dispatched` rows).
_FROM_DISPATCH = {"task_instance": "id", "attempt_token": "attempt_token", "try_number": "try_number",
                  "infrastructure_try_number": "infrastructure_try_number", "item": "map_item"}


def _attempts_insert(now: datetime) -> tuple[str, list[Any]]:
    """An `INSERT ... SELECT` of a new attempt row (`_new_attempt`) for each row of `dispatched`,
    with its parameters: every other column as the model's defaults give it, cast to its type."""
    statement, others = _attempts_insert_shape(connection.vendor)
    return statement, [field.get_db_prep_save(now if field.name == "queued_at" else value, connection) for field, value in others]


@functools.lru_cache(maxsize=2)
def _attempts_insert_shape(vendor: str) -> tuple[str, tuple[tuple[Any, Any], ...]]:
    """`_attempts_insert`'s statement, and each column it binds with the value a new attempt
    has there (its `queued_at` is the dispatch's): built once, not on every dispatch."""
    template = _new_attempt(0, 0, 0, 0, timezone.now())
    columns, values, others = [], [], []
    for field in sql.concrete_fields(TaskAttempt):
        if field.primary_key:
            continue
        columns.append(connection.ops.quote_name(field.column))
        if field.name in _FROM_DISPATCH:
            values.append(f"dispatched.{_FROM_DISPATCH[field.name]}")
        else:
            values.append(f"%s::{field.db_type(connection)}")
            others.append((field, getattr(template, field.attname)))
    statement = f"INSERT INTO {TaskAttempt._meta.db_table} ({', '.join(columns)}) SELECT {', '.join(values)} FROM dispatched"
    return statement, tuple(others)


def _before(ti: TaskInstance) -> dict[str, Any]:
    return {
        "state": ti.state,
        "try_number": ti.try_number,
        "retry_is_platform": ti.retry_is_platform,
        "pre_execution_tries": ti.pre_execution_tries,
        "queued_at": ti.queued_at,
    }


def _db_datetime(value: datetime) -> Any:
    """A datetime as the database backend stores it (SQLite keeps UTC text, without offset)."""
    return connection.ops.adapt_datetimefield_value(value)


def enqueue(queue_name: str, task_instance_id: int, token: int, *, undo: dict[str, Any] | None = None) -> bool:
    """Put one job on Redis (see `enqueue_all`)."""
    return enqueue_all([QueuedJob(queue_name, task_instance_id, token, undo)]) == 1


def enqueue_all(jobs: Iterable[QueuedJob]) -> int:
    """Put the jobs on Redis in one pipeline; return how many went.

    If Redis cannot take them, each dispatch is undone (`undo` holds what the task was): the
    task waits, charged nothing, for a scheduler pass to dispatch it again. A job lost later,
    once in Redis, is found by the scheduler as queue_lost: the database is the truth, Redis
    only delivers."""
    jobs = list(jobs)
    by_queue: dict[str, list[QueuedJob]] = defaultdict(list)
    for job in jobs:
        by_queue[job.queue].append(job)
    if not by_queue:
        return 0
    markers: list[str] = []
    try:
        redis = get_redis()
        markers = enqueuing.begin(redis, [(job.queue, job.queued_at) for job in jobs if job.queued_at is not None])
        with redis.pipeline() as pipe:
            for queue_name, queued in by_queue.items():
                Queue(queue_name, connection=redis).enqueue_many([_job_data(job) for job in queued], pipeline=pipe)
            enqueuing.end(pipe, markers)  # with the jobs: one round trip
            pipe.execute()
    except Exception as exc:
        everything = [job for queued in by_queue.values() for job in queued]
        log.warning("could not enqueue %d job(s) (%s); they wait for the next dispatch", len(everything), exc)
        for job in everything:
            if job.undo is not None and _undo_dispatch(job.task_instance_id, job.token, job.undo) and job.task_instance is not None:
                for name, value in job.undo.items():
                    setattr(job.task_instance, name, value)
        return 0
    return sum(len(queued) for queued in by_queue.values())


def _job_data(job: QueuedJob) -> Any:
    return Queue.prepare_data(
        JOB_FUNCTION,
        args=(job.task_instance_id, job.token),
        job_id=job_id_for(job.task_instance_id, job.token),
        timeout=-1,  # the supervisor enforces execution_timeout, not RQ
        result_ttl=600,
        failure_ttl=86400,
        description=f"task instance {job.task_instance_id} attempt {job.token}",
    )


def _undo_dispatch(task_instance_id: int, token: int, before: dict[str, Any]) -> bool:
    """The job never reached a queue: put the task back as it was, minus its attempt row; return
    whether it was.

    Fenced by the new token and `queued`, so it changes nothing if anything moved the task on.
    The token stays spent: a job with it can never exist."""
    try:
        with transaction.atomic():
            if not transition(task_instance_id, expected=[TaskState.QUEUED], token=token, heartbeat_at=None, **before):
                return False
            TaskAttempt.objects.filter(task_instance_id=task_instance_id, attempt_token=token, state=TaskAttempt.State.QUEUED).delete()
    except Exception:
        log.exception("could not undo the dispatch of task instance %s attempt %s; the scheduler will find it", task_instance_id, token)
        return False
    return True


def first_attempt(ti: TaskInstance) -> TaskAttempt:
    """The attempt row (unsaved here) the dispatch of `ti` wrote, as `ti` was left by it: a run
    created and started in one transaction has no other (`run_creation.ManualRun`)."""
    assert ti.queued_at is not None  # set by its dispatch
    return _new_attempt(ti.pk, ti.attempt_token, ti.try_number, ti.infrastructure_try_number, ti.queued_at, ti.map_item)
