"""What RQ's own records say of a worker of many slots, and what writing them costs: its
heartbeat in one round trip at most once a second however many jobs it takes, and "busy" while
any slot still runs, not "idle" each time it waits for the next job; an attempt's job recorded
when a slot takes it and when it ends, in RQ's formats, one round trip each."""
from __future__ import annotations

import threading
import uuid

import pytest
from rq import Queue
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.suspension import resume, suspend
from rq.worker import WorkerStatus

from orchestrator.engine.dispatch import QueuedJob, enqueue_all
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.worker.host import rqrecords, rqworker
from orchestrator.worker.host.rqworker import OrchestratorWorker


@pytest.fixture
def rq_worker():
    connection = get_redis()
    queue = Queue(f"records-{uuid.uuid4().hex[:8]}", connection=connection)
    worker = OrchestratorWorker([queue], connection=connection, name=f"records-{uuid.uuid4().hex[:8]}", concurrency=2)
    worker.register_birth()
    yield worker
    worker.register_death()
    connection.delete(worker.key)
    for key in connection.scan_iter(f"rq:*{queue.name}*"):
        connection.delete(key)


def _recorded(worker: OrchestratorWorker, field: str) -> str | None:
    value = worker.connection.hget(worker.key, field)
    return value.decode() if value is not None else None


def test_its_heartbeat_is_written_at_most_once_a_second(rq_worker, monkeypatch):
    rq_worker.heartbeat()
    first = _recorded(rq_worker, "last_heartbeat")
    assert first is not None
    assert rq_worker.connection.ttl(rq_worker.key) > 0
    rq_worker.heartbeat()  # a job taken at once: nothing written
    assert _recorded(rq_worker, "last_heartbeat") == first
    monkeypatch.setattr(rqworker, "RQ_HEARTBEAT_EVERY", 0.0)
    rq_worker.heartbeat()
    assert _recorded(rq_worker, "last_heartbeat") != first


def test_a_heartbeat_in_a_callers_pipeline_is_always_written(rq_worker):
    rq_worker.heartbeat()
    first = _recorded(rq_worker, "last_heartbeat")
    with rq_worker.connection.pipeline() as pipe:
        rq_worker.heartbeat(pipeline=pipe)
        pipe.execute()
    assert _recorded(rq_worker, "last_heartbeat") != first


def test_it_stays_busy_while_a_slot_runs_and_is_idle_once_none_does(rq_worker):
    rq_worker.set_state(WorkerStatus.BUSY)
    rq_worker._running["job"] = (None, None)  # a slot running a job
    rq_worker.set_state(WorkerStatus.IDLE)  # RQ's loop, waiting for the next job
    assert _recorded(rq_worker, "state") == WorkerStatus.BUSY
    handed = threading.Thread(target=lambda: None)
    rq_worker._running.clear()
    rq_worker._handed.add(handed)  # a slot running a task handed to it
    rq_worker.set_state(WorkerStatus.IDLE)
    assert _recorded(rq_worker, "state") == WorkerStatus.BUSY
    rq_worker._handed.clear()
    rq_worker.set_state(WorkerStatus.IDLE)
    assert _recorded(rq_worker, "state") == WorkerStatus.IDLE


def test_the_heartbeat_threads_beat_is_never_held_back(rq_worker):
    """Other workers and the pages judge a worker alive by this beat, every heartbeat interval."""
    rq_worker.heartbeat()
    first = _recorded(rq_worker, "last_heartbeat")
    rq_worker._rq_heartbeats()
    assert _recorded(rq_worker, "last_heartbeat") != first


# --- an attempt's job: one round trip when taken, one when it ends ---------------------------------


@pytest.fixture
def attempt_job(rq_worker):
    """An attempt's job as the dispatch enqueues it, taken from its queue as RQ's pop takes it."""
    connection = rq_worker.connection
    enqueue_all([QueuedJob(rq_worker.queues[0].name, uuid.uuid4().int % 10**12, 1, None)])
    job, queue = Queue.dequeue_any(rq_worker.queues, None, connection=connection)
    assert rqrecords.is_attempt(job)
    yield job, queue
    connection.delete(job.key, f"rq:results:{job.id}")


def test_an_attempts_job_taken_is_started_by_its_worker_and_out_of_the_intermediate_list(rq_worker, attempt_job):
    job, queue = attempt_job
    assert rq_worker.connection.lrange(queue.intermediate_queue_key, 0, -1) == [job.id.encode()]
    with rq_worker.connection.pipeline(transaction=False) as pipe:
        rqrecords.record_taken(pipe, job, queue, rq_worker.name)
        pipe.execute()
    stored = Job.fetch(job.id, connection=rq_worker.connection)
    assert stored.get_status() == JobStatus.STARTED
    assert stored.worker_name == rq_worker.name
    assert stored.last_heartbeat is not None
    assert rq_worker.connection.ttl(job.key) == -1
    assert rq_worker.connection.llen(queue.intermediate_queue_key) == 0
    assert job.id not in queue.started_job_registry  # RQ never retries nor fails it behind the engine


def test_an_attempts_job_ended_keeps_its_result_for_its_result_ttl(rq_worker, attempt_job):
    job, queue = attempt_job
    with rq_worker.connection.pipeline(transaction=False) as pipe:
        rqrecords.record_taken(pipe, job, queue, rq_worker.name)
        pipe.execute()
    with rq_worker.connection.pipeline(transaction=False) as pipe:
        rqrecords.record_finished(pipe, job, "success", rq_worker.name)
        pipe.execute()
    stored = Job.fetch(job.id, connection=rq_worker.connection)
    assert stored.get_status() == JobStatus.FINISHED
    assert stored.ended_at is not None
    assert stored.return_value() == "success"
    assert job.id in queue.finished_job_registry
    assert 0 < rq_worker.connection.ttl(job.key) <= 600


def test_an_attempts_job_that_raises_in_a_slot_is_failed_with_its_traceback(rq_worker, attempt_job):
    """No runtime is installed (no `work()`): the job function raises outside any task, and the
    job lands in RQ's failed registry, where the scheduler looks for attempts never claimed."""
    job, queue = attempt_job
    rq_worker.execute_job(job, queue)
    for slot in list(rq_worker._slots):
        slot.join(timeout=10)
    stored = Job.fetch(job.id, connection=rq_worker.connection)
    assert stored.get_status() == JobStatus.FAILED
    assert "runs only in a worker started by run_worker" in stored.latest_result().exc_string
    assert job.id in queue.failed_job_registry
    assert job.id not in queue.started_job_registry
    assert rq_worker.connection.llen(queue.intermediate_queue_key) == 0
    assert _recorded(rq_worker, "failed_job_count") == "1"


def test_the_heartbeat_thread_beats_a_running_attempts_job(rq_worker, attempt_job):
    """Between its worker's pop and its claim, the job's heartbeat is what tells the scheduler
    its worker is alive."""
    job, queue = attempt_job
    with rq_worker.connection.pipeline(transaction=False) as pipe:
        rqrecords.record_taken(pipe, job, queue, rq_worker.name)
        pipe.execute()
    first = rq_worker.connection.hget(job.key, "last_heartbeat")
    rq_worker._running[job.id] = (job, None)
    rq_worker._rq_heartbeats()
    assert rq_worker.connection.hget(job.key, "last_heartbeat") != first
    rq_worker.connection.delete(job.key)  # the job deleted while it runs: a beat does not bring it back
    rq_worker._rq_heartbeats()
    assert not rq_worker.connection.exists(job.key)


def test_rq_suspend_is_honoured_and_asked_at_most_once_a_second(rq_worker, monkeypatch):
    rq_worker.check_for_suspension(burst=True)  # not suspended: goes on
    suspend(rq_worker.connection)
    try:
        rq_worker.check_for_suspension(burst=True)  # asked a moment ago: not asked again
        monkeypatch.setattr(rqworker, "SUSPENSION_CHECK_EVERY", 0.0)
        with pytest.raises(StopRequested):
            rq_worker.check_for_suspension(burst=True)  # a burst worker suspended stops
    finally:
        resume(rq_worker.connection)


def test_a_job_whose_data_cannot_be_read_is_left_to_rqs_own_handling(rq_worker, attempt_job):
    job, _ = attempt_job
    rq_worker.connection.hset(job.key, "data", b"\x00not zlib, not pickle\xff")
    garbled = Job.fetch(job.id, connection=rq_worker.connection)
    assert not rqrecords.is_attempt(garbled)
