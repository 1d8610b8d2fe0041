"""A worker dies or is stopped at every stage of an attempt: queued (claimed, before its task
process exists), starting (before the "running" handshake), running, and reporting; SIGTERM and
a second SIGTERM; SIGSTOP beyond the heartbeat timeout, then SIGCONT."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
from django.db import connection, transaction

from orchestrator.models import TaskInstance
from tests.conftest import wait_until
from tests.faults.conftest import T, alive, settle_runs, task_processes
from tests.faults.invariants import assert_invariants, attempts_of, read_records, violations
from tests.worker.conftest import instance, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _recorded(task_id: str, records, seconds: float, **extra) -> dict:
    return {"task_id": task_id, "python_callable": T + "recorded", "op_kwargs": {"records": str(records), "seconds": seconds, **extra}}


def _pids_started(records, task_id: str) -> list[int]:
    return [r["pid"] for r in read_records([records]) if r["task_id"] == task_id and r["event"] == "start"]


def test_kill_9_while_queued_claimed_and_unclaimed(worker, make_dag, records):
    """Concurrency 2, three tasks, held at worker.before_spawn: two are claimed (still queued, no
    task process), one waits in Redis. kill -9: the two are pre_execution_failure/worker_died on
    the platform budget, the third is simply taken by the next worker; all succeed at try 1."""
    dag = make_dag([_recorded(f"t{i}", records, 0) for i in range(3)])
    run = trigger(dag)
    doomed = worker(ORCHESTRATOR_WORKER_CONCURRENCY="2", ORCHESTRATOR_FAILPOINTS="worker.before_spawn=sleep:60*1")
    wait_until(lambda: run.task_instances.exclude(worker_name="").count() == 2, timeout=20, message="two claimed")
    assert set(run.task_instances.values_list("state", flat=True)) == {"queued"}
    os.kill(doomed.pid, signal.SIGKILL)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="2")
    settle_runs([run])
    claimed = [ti for ti in run.task_instances.all() if ti.attempts.count() == 2]
    assert len(claimed) == 2
    for ti in claimed:
        assert attempts_of(ti) == [("platform", "failed", "pre_execution_failure", 1, 0), ("user", "success", None, 1, 1)]
        first = ti.attempts.order_by("attempt_token").first()
        assert first.context["metadata"]["pre_execution_reason"] == "worker_died"
        assert first.context["source"] == "scheduler"
        assert first.start_date is None
    assert run.state == "success"
    assert_invariants([run], [records])


def test_kill_9_while_starting(worker, make_dag, records):
    """Held at task.before_running (task process forked, no handshake yet): kill -9 of the worker
    kills the task process too (the fork server's watchdog); pre_execution_failure/worker_died,
    platform budget; then success at try 1."""
    dag = make_dag([_recorded(f"t{i}", records, 0) for i in range(2)])
    run = trigger(dag)
    doomed = worker(ORCHESTRATOR_WORKER_CONCURRENCY="2", ORCHESTRATOR_FAILPOINTS="task.before_running=sleep:60*1")
    pids = wait_until(lambda: len(task_processes(doomed.pid)) == 2 and task_processes(doomed.pid), timeout=20, message="two task processes starting")
    assert set(run.task_instances.values_list("state", flat=True)) == {"queued"}
    os.kill(doomed.pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), timeout=5, message="the starting task processes gone")
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="2")
    settle_runs([run])
    for ti in run.task_instances.all():
        assert attempts_of(ti) == [("platform", "failed", "pre_execution_failure", 1, 0), ("user", "success", None, 1, 1)]
        assert ti.attempts.order_by("attempt_token").first().context["metadata"]["pre_execution_reason"] == "worker_died"
    assert_invariants([run], [records])


def test_kill_9_while_running(worker, make_dag, records):
    """Three running tasks (concurrency 3), kill -9: worker_lost on the platform budget, each runs
    again elsewhere, never beside its first copy."""
    dag = make_dag([_recorded(f"t{i}", records, 60) for i in range(3)])
    run = trigger(dag)
    doomed = worker(ORCHESTRATOR_WORKER_CONCURRENCY="3")
    wait_until(lambda: run.task_instances.filter(state="running").count() == 3, timeout=20, message="three running")
    pids = task_processes(doomed.pid)
    assert len(pids) == 3
    os.kill(doomed.pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), timeout=5, message="the running task processes gone")
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="3")
    settle_runs([run])
    for ti in run.task_instances.all():
        assert attempts_of(ti) == [("platform", "failed", "worker_lost", 1, 0), ("user", "success", None, 1, 1)]
        assert ti.last_failure_context["reason"] == "worker_lost"
    assert_invariants([run], [records])


def test_kill_9_while_reporting(worker, make_dag, records, tmp_path):
    """The task finished but its report waits on a locked row when the worker is killed: the
    outcome dies with the worker. The task is found worker_lost and runs again (at least once,
    never twice at once) on the platform budget; the user's try is not spent."""
    go = tmp_path / "go"
    dag = make_dag([_recorded("t", records, 60, hold_until=str(go))])
    run = trigger(dag)
    doomed = worker()
    settle_pid = wait_until(lambda: instance(run, "t").state == "running" and _pids_started(records, "t"), timeout=20)
    first_pid = settle_pid[0]
    with transaction.atomic():
        TaskInstance.objects.select_for_update().get(dag_run=run, task_id="t")
        # The task ends only once its row is locked: its report cannot win a race with the lock.
        go.touch()
        wait_until(lambda: not alive(first_pid), timeout=10, message="the task process to end")

        def report_waiting() -> bool:
            with connection.cursor() as cursor:
                # Inside a transaction PostgreSQL shows pg_stat_activity as it was at its first
                # look, unless told to look again: without this a report that came to the lock
                # after that first look would never be seen.
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                # The success's move: the only statement that sets a task's state and its result
                # (its values are bound apart from the text).
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE %s", ['%SET "state" = %"result" = %'])
                return cursor.fetchone()[0] >= 1

        wait_until(report_waiting, timeout=10, message="the success report to wait on the row lock")
        os.kill(doomed.pid, signal.SIGKILL)
    worker()
    settle_runs([run])
    ti = instance(run, "t")
    assert attempts_of(ti) == [("platform", "failed", "worker_lost", 1, 0), ("user", "success", None, 1, 1)]
    ends = [r for r in read_records([records]) if r["event"] == "end"]
    assert len(ends) == 2  # it ran to the end twice: at least once, as promised
    assert_invariants([run], [records])


def test_sigterm_then_second_sigterm_mid_task(worker, make_dag, records, tmp_path):
    """A 30 s shutdown grace: the first SIGTERM lets the task go on; the second ends the grace at
    once: on_kill(worker_termination), SIGTERM/SIGKILL to its group, infrastructure/worker_termination
    on the platform budget, and the worker exits long before the grace would have ended."""
    on_kill = tmp_path / "on_kill.json"
    dag = make_dag(
        [{"task_id": "t", "python_callable": T + "RecordedSleeper", "op_kwargs": {"records": str(records), "seconds": 60, "on_kill_file": str(on_kill)}}]
    )
    run = trigger(dag)
    stopping = worker(ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="30")
    wait_until(lambda: instance(run, "t").state == "running" and _pids_started(records, "t"), timeout=20, message="running")
    stopping.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # within the grace nothing may happen to the task
    assert stopping.poll() is None
    assert instance(run, "t").state == "running"
    assert not on_kill.exists()
    sent = time.monotonic()
    stopping.send_signal(signal.SIGTERM)
    assert stopping.wait(timeout=15) == 0
    assert time.monotonic() - sent < 10
    context = json.loads(on_kill.read_text())
    assert (context["category"], context["reason"]) == ("infrastructure", "worker_termination")
    ti = instance(run, "t")
    assert ti.state in ("scheduled", "queued")
    assert ti.last_failure_context["reason"] == "worker_termination"
    worker()
    settle_runs([run])
    ti = instance(run, "t")
    assert attempts_of(ti) == [("platform", "failed", "worker_termination", 1, 0), ("user", "success", None, 1, 1)]
    assert_invariants([run], [records])


@pytest.mark.parametrize(
    "check",
    [
        "resumed_copy_killed",
        "never_two_at_once",
    ],
)
def test_sigstop_beyond_heartbeat_timeout_then_sigcont(worker, make_dag, records, check):
    """SIGSTOP a worker mid-task for longer than the heartbeat timeout: the scheduler finds its
    task worker_lost and another worker runs it again. On SIGCONT the stopped worker must kill
    its copy at once, and the two copies must never have run at the same time."""
    dag = make_dag([_recorded("t", records, 30, long_until_platform_try=2)])
    run = trigger(dag)
    # Concurrency 1: with a free slot the stopped worker would sit in Redis's blocking pop and be
    # handed the retry's job (see the next test).
    # The worker's lease must use the heartbeat timeout the scheduler presumes by (2 s here).
    stopped = worker(ORCHESTRATOR_WORKER_CONCURRENCY="1", ORCHESTRATOR_HEARTBEAT_TIMEOUT="2")
    wait_until(lambda: instance(run, "t").state == "running" and _pids_started(records, "t"), timeout=20, message="running")
    first_pid = _pids_started(records, "t")[0]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        worker()
        def second_copy() -> bool:
            from orchestrator.engine.scheduler import schedule_once

            schedule_once()
            return len(_pids_started(records, "t")) >= 2

        wait_until(second_copy, timeout=30, interval=0.1, message="a second copy started on the other worker")
        time.sleep(1.0)  # both copies are now alive long enough to be seen together, if they are
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    wait_until(lambda: not alive(first_pid), timeout=5, message="the resumed worker to kill its stale copy")
    ti = instance(run, "t")
    first = ti.attempts.order_by("attempt_token").first()
    assert (first.kind, first.context["reason"]) == ("platform", "worker_lost")
    if check == "resumed_copy_killed":
        return
    problems = violations([run], [records], settled=False)
    assert not problems, "\n".join(problems)


def test_a_stopped_worker_with_a_free_slot_does_not_hold_the_retry(worker, make_dag, records, settings):
    """SIGSTOP a worker with free slots mid-task and keep it stopped: the task is found
    worker_lost, and its retry must still reach the other worker (within the queued timeout)."""
    settings.ORCHESTRATOR_QUEUED_TIMEOUT = 3
    dag = make_dag([_recorded("t", records, 30)])
    run = trigger(dag)
    stopped = worker(ORCHESTRATOR_WORKER_CONCURRENCY="4")
    wait_until(lambda: instance(run, "t").state == "running" and _pids_started(records, "t"), timeout=20, message="running")
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="4")
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        settle_runs([run], timeout=25)
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    assert instance(run, "t").state == "success"


def test_kill_9_between_taking_the_job_and_claiming_it(worker, make_dag, records, settings):
    """The worker has taken the job from Redis (RQ says `started`) but not yet claimed the attempt
    in the database (held here by a row lock) when it is killed with -9: the task must still be
    found and run again, within the queued timeout, not wait for RQ's own clean-up."""
    from orchestrator.foundation.redis_conn import job_statuses

    settings.ORCHESTRATOR_QUEUED_TIMEOUT = 3
    dag = make_dag([_recorded("t", records, 0)])
    run = trigger(dag)
    with transaction.atomic():
        ti = TaskInstance.objects.select_for_update().get(dag_run=run, task_id="t")
        doomed = worker()
        wait_until(lambda: job_statuses([ti.job_id]) == ["started"], timeout=20, message="the job taken by the worker")
        os.kill(doomed.pid, signal.SIGKILL)
    assert instance(run, "t").worker_name == ""  # never claimed
    worker()
    settle_runs([run], timeout=20)
    assert instance(run, "t").state == "success"
    assert_invariants([run], [records])
