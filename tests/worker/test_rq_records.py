"""What RQ's own records say of a worker of many slots, and what writing them costs: its
heartbeat in one round trip at most once a second however many jobs it takes, and "busy" while
any slot still runs, not "idle" each time it waits for the next job."""
from __future__ import annotations

import threading
import uuid

import pytest
from rq import Queue
from rq.worker import WorkerStatus

from orchestrator.foundation.redis_conn import get_redis
from orchestrator.worker.host import rqworker
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
