"""`manage.py check_alive scheduler|worker`: the probes of the chart's scheduler and worker pods,
run against real `run_scheduler` and `run_worker` processes that are alive, frozen (SIGSTOP) or
killed, and against a Redis that is not there."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest

from orchestrator.foundation.liveness import Verdict, judge
from tests.conftest import ROOT, wait_until


@pytest.fixture
def check_alive(process_env):
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "check_alive", *args],
            env={**process_env, **(env or {})},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture(autouse=True)
def no_heartbeats_yet(process_env):
    """Forget the records of processes earlier tests ran on this host (this run's Redis database)."""
    from orchestrator.foundation.redis_conn import get_redis

    client = get_redis()
    for key in [*client.scan_iter("rq:worker:*"), *client.scan_iter("orchestrator:alive:*"), "rq:workers"]:
        client.delete(key)


def alive(result: subprocess.CompletedProcess) -> bool:
    return result.returncode == 0


# --- the rule ------------------------------------------------------------------------------------


def test_judge_takes_the_newest_beat_of_the_host():
    beats = [("host.7", 100.0), ("host.9", 130.0)]  # a dead worker's record, and the live one's
    assert judge(beats, what="worker", hostname="host", max_age=30, now=150.0) == Verdict(True, "worker host.9: last heartbeat 20.0s ago")
    stale = judge(beats, what="worker", hostname="host", max_age=10, now=150.0)
    assert stale.alive is False
    assert "20s ago (more than 10s)" in stale.message
    assert judge([], what="scheduler", hostname="host", max_age=10, now=0).alive is False


# --- real processes ------------------------------------------------------------------------------


def test_a_live_worker_is_alive_until_it_freezes_or_dies(spawn, check_alive):
    worker = spawn("run_worker", f"q-{uuid.uuid4().hex[:8]}", env={"ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.2"})
    wait_until(lambda: alive(check_alive("worker", "--max-age=2")), timeout=60, interval=0.5, message="the worker's first heartbeat")
    result = check_alive("worker", "--max-age=2")
    assert f"{socket.gethostname()}.{worker.pid}" in result.stdout
    # Frozen: the record stays, its heartbeat ages.
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        result = wait_until(lambda: (r := check_alive("worker", "--max-age=1")).returncode == 1 and r, timeout=30, interval=0.5)
        assert "last heartbeat" in result.stderr
        assert "more than 1s" in result.stderr
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    wait_until(lambda: alive(check_alive("worker", "--max-age=2")), timeout=30, interval=0.5, message="the thawed worker's heartbeat")
    # Killed: nothing refreshes its record any more.
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    wait_until(lambda: check_alive("worker", "--max-age=1").returncode == 1, timeout=30, interval=0.5, message="the dead worker to be judged dead")


def test_no_worker_on_this_host_is_not_alive(check_alive):
    result = check_alive("worker")
    assert result.returncode == 1
    assert f"no worker of host {socket.gethostname()} has recorded a heartbeat" in result.stderr


def test_a_scheduler_is_alive_while_its_passes_go_on(spawn, check_alive):
    assert check_alive("scheduler").returncode == 1  # none has run yet
    scheduler = spawn("run_scheduler", env={"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2"})
    wait_until(lambda: alive(check_alive("scheduler", "--max-age=2")), timeout=60, interval=0.5, message="the scheduler's first pass")
    os.kill(scheduler.pid, signal.SIGSTOP)
    try:
        result = wait_until(lambda: (r := check_alive("scheduler", "--max-age=1")).returncode == 1 and r, timeout=30, interval=0.5)
        assert "scheduler" in result.stderr
        assert "last heartbeat" in result.stderr
    finally:
        os.kill(scheduler.pid, signal.SIGCONT)
    wait_until(lambda: alive(check_alive("scheduler", "--max-age=2")), timeout=30, interval=0.5, message="the thawed scheduler's pass")


def test_redis_out_of_reach_passes_liveness_and_fails_readiness(check_alive):
    """A restart would not bring Redis back (and would stop a worker's running tasks): liveness
    says it cannot tell and passes; readiness fails."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    live = check_alive("worker", env=env)
    assert live.returncode == 0
    assert "cannot tell" in live.stdout
    ready = check_alive("worker", "--ready", env=env)
    assert ready.returncode == 1
    assert "Redis is out of reach" in ready.stderr
