"""RQ's records of an attempt's job: one round trip when a slot takes it, one when it ends.

The database holds the truth of every attempt (its claim, heartbeat and report, fenced by the
attempt token); RQ's job only carries it to a worker. Of RQ's records the engine reads just
this: a job's status, and its `last_heartbeat` between the worker's pop and its claim (the
scheduler's search for lost jobs, `scheduler._find_lost_jobs`), and the failed registry (a job
RQ failed is final). RQ's own handling of a job wrote five more records for every job, an
execution, its registry entries and their expiries, and read the job's dependents under a WATCH:
three round trips and some thirty commands, about two fifths of a worker's CPU in a fan-out.
An attempt's job is therefore recorded here, in RQ's own formats, with what is read of it:

- taken: `started` with its worker, start time and heartbeat, persisted, out of the queue's
  intermediate list, and the worker `busy`, in one round trip;
- beaten while it runs (`beat`), so that a worker that dies before its claim is seen;
- ended: `finished` with its end time and result (`Job.return_value()`), in the finished
  registry, expiring with its result_ttl; or, if the job function raised outside its task,
  `failed` with the traceback in the failed registry, as RQ records it.

Attempt jobs are never in RQ's started registry (no execution is created for them): nothing
of RQ retries or fails them behind the engine's back. Any other job (a deadline's callback)
goes through RQ's own handling.
"""
from __future__ import annotations

from typing import Any

from rq.defaults import DEFAULT_RESULT_TTL
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.results import Result
from rq.utils import now, utcformat

from orchestrator.engine.dispatch import JOB_FUNCTION


def is_attempt(job: Job) -> bool:
    """A job of the engine's dispatch (`dispatch.JOB_FUNCTION`): one attempt of a task instance.
    Not a job whose data RQ cannot read: RQ's own handling fails it."""
    try:
        return job.func_name == JOB_FUNCTION
    except Exception:
        return False


def record_taken(pipeline: Any, job: Job, queue: Queue, worker_name: str) -> None:
    """The job `started` by `worker_name`, kept (a job taken never expires under its worker), and
    out of the intermediate list RQ's pop moved it to."""
    job.prepare_for_execution(worker_name, pipeline=pipeline)
    pipeline.persist(job.key)
    pipeline.lrem(queue.intermediate_queue_key, 1, job.id)


def beat(pipeline: Any, jobs: list[Job]) -> list[int]:
    """The running jobs' heartbeats; the position in the pipeline of each one's HSET, whose reply
    is 1 when it created the key (the job was deleted meanwhile: `forget_recreated`)."""
    at = now()
    positions = []
    for job in jobs:
        positions.append(len(pipeline))
        job.heartbeat(at, 0, pipeline=pipeline)
    return positions


def forget_recreated(pipeline: Any, jobs: list[Job], positions: list[int], replies: list[Any]) -> bool:
    """Delete the keys a heartbeat created (of jobs deleted while they ran); whether any was."""
    recreated = [job for job, position in zip(jobs, positions) if replies[position] == 1]
    for job in recreated:
        pipeline.delete(job.key)
    return bool(recreated)


def record_finished(pipeline: Any, job: Job, return_value: Any, worker_name: str) -> None:
    """The job `finished` with its end time and result, kept for its result_ttl."""
    ended_at = job.ended_at or now()
    ttl = job.get_result_ttl(DEFAULT_RESULT_TTL)
    job.set_status(JobStatus.FINISHED, pipeline=pipeline)
    pipeline.hset(job.key, "ended_at", utcformat(ended_at))
    if ttl == 0:
        pipeline.delete(job.key)
        return
    Result.create(
        job, Result.Type.SUCCESSFUL, return_value=return_value, ttl=ttl, worker_name=worker_name, pipeline=pipeline,
        execution_started_at=job.started_at, execution_ended_at=ended_at,
    )
    job.finished_job_registry.add(job, ttl, pipeline=pipeline)
    if ttl > 0:
        pipeline.expire(job.key, ttl)


def record_failed(pipeline: Any, job: Job, traceback_text: str, worker_name: str) -> None:
    """The job `failed`, with its traceback, in its queue's failed registry for its failure_ttl:
    the scheduler reads it there, and fails the attempt at once if the job never claimed it."""
    ended_at = job.ended_at or now()
    job.set_status(JobStatus.FAILED, pipeline=pipeline)
    pipeline.hset(job.key, "ended_at", utcformat(ended_at))
    job._handle_failure(traceback_text, pipeline=pipeline, worker_name=worker_name, execution_started_at=job.started_at, execution_ended_at=ended_at)
