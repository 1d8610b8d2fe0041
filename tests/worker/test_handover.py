"""A worker that ends a task runs the task it made ready in the same slot, with no job on Redis
for it; a backlog keeps its order; a worker that dies holding a handed task loses nothing."""
from __future__ import annotations

import signal

import pytest
from rq.job import Job

from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import job_id_for
from tests.worker.conftest import instance, settle, trigger

T = "tests.worker.tasks."

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _had_a_job(ti, token: int) -> bool:
    return Job.exists(job_id_for(ti.pk, token), connection=get_redis())


def test_a_chain_runs_each_next_task_in_the_slot_that_ended_the_last(worker, make_dag):
    dag = make_dag([
        {"task_id": "a", "python_callable": T + "results_and_pid"},
        {"task_id": "b", "python_callable": T + "results_and_pid", "upstream": ["a"]},
        {"task_id": "c", "python_callable": T + "results_and_pid", "upstream": ["b"]},
    ])
    worker()
    worker()
    run = trigger(dag)
    c = settle(run, "c", ("success",))
    a, b = instance(run, "a"), instance(run, "b")
    assert a.state == b.state == "success"
    assert _had_a_job(a, a.attempt_token)  # the root came from Redis (its result is kept 600 s)
    assert not _had_a_job(b, b.attempt_token)
    assert not _had_a_job(c, c.attempt_token)
    holders = {ti.attempts.get().worker_name for ti in (a, b, c)}
    assert len(holders) == 1
    assert holders != {""}
    assert b.result["results"] == {"a": a.result}
    assert c.result["results"] == {"b": b.result}
    assert b.attempts.get().pid
    assert b.attempts.get().start_date is not None


def test_upstream_results_many_times_the_channels_buffer_reach_the_task(worker, make_dag):
    """The payload and the results go down the task's channel before it starts: 600,000
    characters (a socket's buffer is some 200 KB) arrive whole, in a handed slot or a popped job."""
    size = 60_000
    tasks = [{"task_id": f"u{n}", "python_callable": T + "give", "op_kwargs": {"size": size}} for n in range(10)]
    dag = make_dag([*tasks, {"task_id": "sink", "python_callable": T + "result_sizes", "upstream": [t["task_id"] for t in tasks]}])
    worker(ORCHESTRATOR_RESULT_MAX_BYTES=str(size + 100))
    sink = settle(trigger(dag), "sink", ("success",), timeout=60)
    assert sink.result == {f"u{n}": size for n in range(10)}


def test_a_backlog_keeps_its_order(worker, make_dag):
    """The worker's queue holds a job when its task ends: the next task is enqueued behind it,
    not run ahead of it."""
    chain = make_dag([
        {"task_id": "a", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 1.5}},
        {"task_id": "b", "python_callable": T + "succeed", "upstream": ["a"]},
    ])
    other = make_dag([{"task_id": "waiting", "python_callable": T + "succeed"}])
    worker(ORCHESTRATOR_WORKER_CONCURRENCY=1)
    run = trigger(chain)
    settle(run, "a", ("running",))
    behind = trigger(other)  # its job waits: the only slot is busy
    b = settle(run, "b", ("success",))
    waiting = instance(behind, "waiting")
    assert waiting.state == "success"
    assert _had_a_job(b, b.attempt_token)
    assert waiting.attempts.get().start_date < b.attempts.get().start_date


def test_a_worker_killed_holding_a_handed_task_loses_nothing(worker, make_dag):
    """The handed task is claimed by the report's commit: its worker killed before starting it
    leaves a claimed task, found with a stale heartbeat (pre_execution_failure/worker_died,
    charged to the platform) and run by another worker."""
    dag = make_dag([
        {"task_id": "a", "python_callable": T + "succeed"},
        {"task_id": "b", "python_callable": T + "succeed", "upstream": ["a"]},
    ], retries=0)
    doomed = worker(ORCHESTRATOR_FAILPOINTS="worker.before_spawn@b=kill*1")
    run = trigger(dag)
    assert doomed.wait(timeout=20) == -9
    first = instance(run, "b")
    assert first.state == "queued"
    assert first.heartbeat_at is not None
    assert not _had_a_job(first, first.attempt_token)
    worker()
    b = settle(run, "b", ("success",))
    assert (b.try_number, b.infrastructure_try_number) == (1, 1)
    lost = b.attempts.get(attempt_token=first.attempt_token)
    assert lost.kind == "platform"
    assert lost.context["source"] == "scheduler"
    assert lost.context["reason"] == "pre_execution_failure"
    assert lost.context["metadata"]["pre_execution_reason"] == "worker_died"


def test_a_draining_worker_hands_nothing_to_itself(worker, make_dag):
    """SIGUSR1 (stop taking jobs): the task its running task makes ready goes to Redis for
    another worker, and the draining worker exits once its task ends."""
    dag = make_dag([
        {"task_id": "a", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 1.0}},
        {"task_id": "b", "python_callable": T + "succeed", "upstream": ["a"]},
    ])
    draining = worker()
    run = trigger(dag)
    settle(run, "a", ("running",))
    draining.send_signal(signal.SIGUSR1)
    assert draining.wait(timeout=20) == 0
    b = instance(run, "b")
    assert b.state == "queued"
    assert b.heartbeat_at is None
    assert _had_a_job(b, b.attempt_token)
    worker()
    b = settle(run, "b", ("success",))
    assert b.attempts.get().worker_name not in ("", instance(run, "a").attempts.get().worker_name)


def _supervise(ti, on_started):
    """One attempt of `ti` under a real supervisor, fork server and task process."""
    import os

    from orchestrator.engine import reporting
    from orchestrator.worker.host.heartbeat import Heartbeats
    from orchestrator.worker.host.job import plan_for, supervisor_settings
    from orchestrator.worker.host.launcher import Launcher
    from orchestrator.worker.host.supervisor import Supervisor

    worker_info = reporting.WorkerInfo(hostname="test", worker_name="test-started", pid=os.getpid())
    claimed = reporting.claim(ti.pk, ti.attempt_token, worker_info)
    assert claimed is not None
    launcher = Launcher()
    try:
        return Supervisor(
            plan_for(claimed), worker_info, supervisor_settings(), launcher=launcher,
            heartbeats=Heartbeats(interval=0.2, timeout=30), on_started=on_started,
        ).run()
    finally:
        launcher.close()


def test_the_slot_that_handed_its_place_on_hears_when_the_task_it_handed_has_started(make_dag):
    """The supervisor says when the task's code may run (its "running" recorded, "go" sent):
    the slot that handed the task on waits for that before its own after-work. A task that
    never gets that far is never said to have started."""
    from orchestrator.engine.run_creation import create_manual_run
    from orchestrator.worker.final import StartupFailed, Succeeded

    dag = make_dag([
        {"task_id": "ok", "python_callable": T + "succeed"},
        {"task_id": "broken", "python_callable": "tests.worker.no_such_module.task"},
    ])
    run = create_manual_run(dag)
    states_when_started: list[str] = []
    supervised = _supervise(instance(run, "ok"), lambda: states_when_started.append(instance(run, "ok").state))
    supervised.finish()
    assert isinstance(supervised.outcome.final, Succeeded)
    assert states_when_started == ["running"]  # once, and only once the handshake was recorded

    started: list[bool] = []
    supervised = _supervise(instance(run, "broken"), lambda: started.append(True))
    supervised.finish()
    assert isinstance(supervised.outcome.final, StartupFailed)
    assert started == []
