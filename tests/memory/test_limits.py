"""Memory limits through real workers: a task past its limit, a task killed from outside, retries
that get more memory, retries sent to a bigger worker, and the cgroups a killed worker left.

Every test that takes `mode` runs with a cgroup per attempt (where this machine has memory
cgroups) and with the watched mode forced by ORCHESTRATOR_MEMORY_LIMITS=watched."""
from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import pytest
from django.core.management import CommandError, call_command

from orchestrator.models import TaskAttempt
from orchestrator.worker.host import memory
from tests.conftest import wait_until
from tests.worker.conftest import running_pid, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

# Seconds from its start within which a task that takes 256 MiB at once under a 64 MiB limit
# must have been stopped (the contract's 5 s from crossing, and the task's own start-up).
STOPPED_WITHIN = 5.0
GRANDCHILD = f"""{sys.executable} -c 'import time; block = bytearray(256 << 20); time.sleep(60)'"""


def _attempts(ti) -> list[TaskAttempt]:
    return list(ti.attempts.order_by("attempt_token"))


def _exceeded(attempt: TaskAttempt, limit: int, mode: str) -> None:
    context = attempt.context
    assert (context["category"], context["reason"]) == ("application", "memory_limit_exceeded"), context
    metadata = context["metadata"]
    assert metadata["memory_limit_mib"] == limit, metadata
    assert metadata["enforced_by"] == mode, metadata
    assert metadata["peak_mib"] >= (limit if mode == "cgroup" else limit + 1) - 1, metadata
    assert attempt.kind == "user"
    assert attempt.fingerprint is None
    assert attempt.memory_limit_mib == limit
    assert attempt.peak_memory_mib == metadata["peak_mib"]
    assert (attempt.end_date - attempt.start_date).total_seconds() < STOPPED_WITHIN


def test_a_python_task_past_its_limit_fails_as_memory_limit_exceeded(worker, make_dag, mode):
    dag = make_dag([{"task_id": "big", "python_callable": "tests.memory.tasks.allocate", "op_kwargs": {"mib": 256}}], memory_limit=64)
    proc = worker(ORCHESTRATOR_MEMORY_LIMITS=mode)
    ti = settle(trigger(dag), "big", ("failed",), timeout=60)
    (attempt,) = _attempts(ti)
    _exceeded(attempt, 64, mode)
    wait_until(lambda: any(f"memory limits {'enforced by a cgroup' if mode == 'cgroup' else 'watched'}" in line for line in proc.log_lines),
               timeout=5, message="the worker to log how it limits memory")


def test_a_bash_tasks_grandchild_past_the_limit_fails_the_task_whatever_bash_does(worker, make_dag, mode):
    """bash would go on after its child was killed, and exit 0: the attempt fails all the same,
    every process of it stopped."""
    command = f'bash -c "{GRANDCHILD}"; echo "bash goes on"; sleep 60'
    dag = make_dag([{"task_id": "big", "bash_command": command}], memory_limit=64)
    worker(ORCHESTRATOR_MEMORY_LIMITS=mode)
    ti = settle(trigger(dag), "big", ("failed",), timeout=60)
    (attempt,) = _attempts(ti)
    _exceeded(attempt, 64, mode)


def test_a_task_under_its_limit_killed_from_outside_is_resource_exhaustion_without_oom(worker, make_dag, mode):
    dag = make_dag([{"task_id": "calm", "python_callable": "tests.memory.tasks.sleep"}], memory_limit=256, infrastructure_retry_limit=0)
    worker(ORCHESTRATOR_MEMORY_LIMITS=mode)
    run = trigger(dag)
    os.kill(running_pid(run, "calm", timeout=60), signal.SIGKILL)
    ti = settle(run, "calm", ("failed",), timeout=60)
    (attempt,) = _attempts(ti)
    context = attempt.context
    assert (context["category"], context["reason"]) == ("infrastructure", "resource_exhaustion"), context
    assert "oom" not in context["metadata"]
    assert attempt.memory_limit_mib == 256
    assert attempt.peak_memory_mib is not None
    assert attempt.peak_memory_mib < 256


def test_each_memory_limit_exceeded_steps_the_limit_up_and_never_poisons(worker, make_dag, mode):
    """32 MiB, then 64, then 128, where the task fits: two memory_limit_exceeded, a success, and
    no dead letter though poison_threshold is 2."""
    task = {"task_id": "grows", "python_callable": "tests.memory.tasks.allocate", "op_kwargs": {"mib": 96, "hold": 1}}
    dag = make_dag([task], memory_limit=32, memory_limit_on_retry=[64, 128], retries=3, poison_threshold=2)
    worker(ORCHESTRATOR_MEMORY_LIMITS=mode)
    ti = settle(trigger(dag), "grows", ("success", "failed", "dead_letter"), timeout=90)
    assert ti.state == "success"
    attempts = _attempts(ti)
    assert [a.memory_limit_mib for a in attempts] == [32, 64, 128]
    assert [a.context and a.context["reason"] for a in attempts] == ["memory_limit_exceeded", "memory_limit_exceeded", None]
    assert ti.memory_limit_mib == 128
    assert ti.try_number == 3


def test_queue_on_oom_sends_every_later_attempt_to_the_big_workers(worker, worker_on, make_dag, queue_name, mode):
    big = f"big-{uuid.uuid4().hex[:8]}"
    task = {"task_id": "grows", "python_callable": "tests.memory.tasks.allocate", "op_kwargs": {"mib": 96, "hold": 1}}
    dag = make_dag([task], memory_limit=32, memory_limit_on_retry=[256], queue_on_oom=big, retries=2)
    worker(ORCHESTRATOR_MEMORY_LIMITS=mode)
    worker_on(big, ORCHESTRATOR_MEMORY_LIMITS=mode)
    ti = settle(trigger(dag), "grows", ("success", "failed"), timeout=90)
    assert ti.state == "success"
    assert ti.queue == big
    first, second = _attempts(ti)
    assert first.context["reason"] == "memory_limit_exceeded"
    assert first.memory_limit_mib == 32
    assert second.memory_limit_mib == 256
    assert second.worker_name != first.worker_name


def test_the_cgroups_of_a_killed_worker_are_removed_by_the_next_one(worker, make_dag, cgroup_root):
    dag = make_dag([{"task_id": "calm", "python_callable": "tests.memory.tasks.sleep"}], memory_limit=128)
    first = worker(ORCHESTRATOR_MEMORY_LIMITS="cgroup")
    run = trigger(dag)
    pid = running_pid(run, "calm", timeout=60)
    (directory,) = [path for path in cgroup_root.iterdir() if path.name.startswith(f"orchestrator-{first.pid}-")]
    attempt_cgroups = [path for path in directory.iterdir() if path.name.startswith("ti-")]
    assert len(attempt_cgroups) == 1
    assert str(pid) in (attempt_cgroups[0] / "cgroup.procs").read_text().split()
    first.kill()
    first.wait()
    worker(ORCHESTRATOR_MEMORY_LIMITS="cgroup")
    started = time.monotonic()
    wait_until(lambda: not directory.exists(), timeout=30, message="the dead worker's cgroups to be removed")
    assert time.monotonic() - started < 30


def test_an_ended_attempts_cgroup_is_removed_at_once(worker, make_dag, cgroup_root):
    dag = make_dag([{"task_id": "quick", "bash_command": "true"}], memory_limit=64)
    proc = worker(ORCHESTRATOR_MEMORY_LIMITS="cgroup")
    ti = settle(trigger(dag), "quick", ("success",), timeout=60)
    (attempt,) = _attempts(ti)
    assert attempt.memory_limit_mib == 64
    assert attempt.peak_memory_mib is not None
    (directory,) = [path for path in cgroup_root.iterdir() if path.name.startswith(f"orchestrator-{proc.pid}-")]
    wait_until(lambda: not any(path.name.startswith("ti-") for path in directory.iterdir()), timeout=10, message="the attempt's cgroup to go")


def test_a_worker_told_to_use_cgroups_where_it_cannot_refuses_to_start(settings, monkeypatch, tmp_path):
    settings.ORCHESTRATOR_MEMORY_LIMITS = "cgroup"
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path)  # no cgroup filesystem there
    with pytest.raises(CommandError, match="ORCHESTRATOR_MEMORY_LIMITS=cgroup, but no memory cgroup"):
        call_command("run_worker", "nobody-listens-here")
