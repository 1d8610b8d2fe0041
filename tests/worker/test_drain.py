"""SIGUSR1 drains a worker (the chart's preStop sends it): no new job, running tasks go on, no
shutdown grace started. The kubelet's SIGTERM that follows is still the first termination
signal: it starts the grace, and a task it stops is `worker_termination` on the platform budget."""
from __future__ import annotations

import signal
import socket
import time

from orchestrator.foundation.redis_conn import get_redis
from tests.conftest import wait_until
from tests.worker.conftest import instance, settle, trigger


def test_a_drained_worker_takes_no_job_and_sigterm_still_gives_the_grace(worker, make_dag):
    long_dag = make_dag([{"task_id": "t", "bash_command": "sleep 60"}])
    run = trigger(long_dag)
    proc = worker(ORCHESTRATOR_WORKER_CONCURRENCY="2", ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="3", ORCHESTRATOR_KILL_GRACE="1")
    settle(run, "t", ("running",), timeout=60)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1.0)
    later = trigger(make_dag([{"task_id": "u", "bash_command": "true"}]))
    settle(later, "u", ("queued",))
    # Longer than the shutdown grace: had SIGUSR1 started it, the task would be stopped by now.
    time.sleep(4.0)
    assert proc.poll() is None
    assert instance(run, "t").state == "running"
    assert instance(later, "u").state == "queued"
    assert instance(later, "u").worker_name == ""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - sent >= 3.0  # the grace ran from the SIGTERM
    ti = wait_until(lambda: (ti := instance(run, "t")).state in ("scheduled", "queued") and ti, timeout=20, message="t to be requeued")
    assert (ti.last_failure_context["category"], ti.last_failure_context["reason"]) == ("infrastructure", "worker_termination")
    assert ti.try_number == 1
    assert ti.infrastructure_try_number == 1
    assert instance(later, "u").state == "queued"


def test_a_drained_worker_finishes_its_task_then_exits(worker, make_dag):
    run = trigger(make_dag([{"task_id": "t", "bash_command": "sleep 2"}]))
    proc = worker(ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="30")
    settle(run, "t", ("running",), timeout=60)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 0
    assert instance(run, "t").state == "success"


def test_an_idle_worker_exits_at_once_when_drained(worker):
    proc = worker()
    # Registered with RQ: its signal handlers are installed right after. (Before that SIGUSR1
    # would kill it, as SIGTERM would; on Kubernetes the worker is PID 1, which ignores both.)
    key = f"rq:worker:{socket.gethostname()}.{proc.pid}"
    wait_until(lambda: get_redis().exists(key), timeout=60, message="the worker to register")
    time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 0
