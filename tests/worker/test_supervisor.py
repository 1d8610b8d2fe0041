"""What the supervisor enforces: timeouts, kills, shutdown grace, and never two copies at once."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from django.db import connection

from orchestrator.engine import reporting
from orchestrator.engine.scheduler import schedule_once
from orchestrator.worker.host.procs import live_members
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.conftest import wait_until
from tests.worker.conftest import gone, instance, running_pid, settle, trigger
from tests.worker.proxy import TcpProxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.worker.tasks."


def test_it_kills_a_task_past_its_timeout_and_its_whole_process_group(worker, make_dag, tmp_path):
    """execution_timeout: SIGTERM (on_kill gets the timeout context), then SIGKILL after kill_grace
    to the whole group, grandchildren included; charged as timeout/execution_timeout."""
    marker = str(tmp_path / "stubborn")
    on_kill_file = tmp_path / "on_kill.json"
    dag = make_dag(
        [{"task_id": "slow", "python_callable": T + "stubborn_with_child", "op_kwargs": {"seconds": 60, "marker": marker}}],
        execution_timeout=1,
        kill_grace=0.5,
    )
    worker(TEST_ON_KILL_FILE=str(on_kill_file))
    run = trigger(dag)
    pid = running_pid(run, "slow")
    ti = settle(run, "slow", ("failed",), timeout=10)
    attempt = ti.attempts.get()
    assert attempt.kind == "user"
    assert attempt.context["category"] == "timeout"
    assert attempt.context["reason"] == "execution_timeout"
    metadata = attempt.context["metadata"]
    assert metadata["timeout"] == 1
    assert metadata["signal_sent"] == "SIGTERM"
    assert metadata["sigkill_sent"] is True
    seen_by_on_kill = json.loads(on_kill_file.read_text())
    assert (seen_by_on_kill["category"], seen_by_on_kill["reason"], seen_by_on_kill["pid"]) == ("timeout", "execution_timeout", pid)
    grandchild = int(Path(marker + ".child").read_text())
    assert gone(grandchild)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the worker reaped them all: not even a zombie is left in the group


def test_it_kills_a_bash_task_that_ignores_sigterm_after_the_grace(worker, make_dag):
    """A bash task trapping SIGTERM past its timeout: SIGKILL to the group after kill_grace."""
    dag = make_dag([{"task_id": "b", "bash_command": "trap '' TERM; sleep 30; sleep 30"}], execution_timeout=0.5, kill_grace=0.5)
    worker()
    run = trigger(dag)
    pid = running_pid(run, "b")
    ti = settle(run, "b", ("failed",), timeout=10)
    context = ti.attempts.get().context
    assert (context["reason"], context["metadata"]["sigkill_sent"]) == ("execution_timeout", True)
    assert live_members(pid) == []


def test_it_counts_an_outside_sigkill_as_resource_exhaustion_and_retries_on_the_platform(worker, make_dag):
    """SIGKILL the task process from outside (as the OOM killer would): infrastructure/resource_exhaustion,
    platform retry keeping try_number, and the retry succeeds."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 30}}])
    worker()
    run = trigger(dag)
    os.kill(running_pid(run, "t"), signal.SIGKILL)
    ti = settle(run, "t", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)
    killed = ti.attempts.get(attempt_token=1)
    assert killed.kind == "platform"
    assert killed.context["category"] == "infrastructure"
    assert killed.context["reason"] == "resource_exhaustion"
    assert killed.context["metadata"]["signal"] == "SIGKILL"
    assert killed.context["metadata"]["exit_code"] == -9
    assert ti.last_failure_context["reason"] == "resource_exhaustion"


def test_it_stops_the_task_after_the_shutdown_grace_and_another_worker_finishes_it(worker, make_dag, tmp_path):
    """Worker SIGTERM mid-task: the task goes on for the grace, then is stopped with a
    worker_termination context (on_kill sees it); charged to the platform; a second worker runs it."""
    on_kill_file = tmp_path / "on_kill.json"
    dag = make_dag(
        [{"task_id": "t", "python_callable": T + "GracefulSleeper", "op_kwargs": {"seconds": 30, "on_kill_file": str(on_kill_file)}}]
    )
    first = worker(ORCHESTRATOR_WORKER_SHUTDOWN_GRACE=0.5)
    run = trigger(dag)
    pid = running_pid(run, "t")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=10) == 0
    assert gone(pid)
    seen_by_on_kill = json.loads(on_kill_file.read_text())
    assert (seen_by_on_kill["category"], seen_by_on_kill["reason"]) == ("infrastructure", "worker_termination")
    ti = instance(run, "t")
    # The platform retry delay is 0 here, so the stopping worker's report dispatched it again at once.
    assert (ti.state, ti.attempt_token) == ("queued", 2)
    stopped = ti.attempts.get(attempt_token=1)
    assert stopped.kind == "platform"
    assert stopped.context["reason"] == "worker_termination"
    assert stopped.context["source"] == "worker"
    assert stopped.context["metadata"]["signal"] == "SIGTERM"
    worker()
    ti = settle(run, "t", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)


def test_it_reports_the_real_outcome_of_a_task_that_ends_within_the_shutdown_grace(worker, make_dag):
    """Worker SIGTERM while a short task runs: the task finishes, its success is reported, the worker exits."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 1}}])
    first = worker(ORCHESTRATOR_WORKER_SHUTDOWN_GRACE=10)
    run = trigger(dag)
    running_pid(run, "t")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=10) == 0
    ti = instance(run, "t")
    assert ti.state == "success"
    assert ti.attempts.get().kind == "user"


def test_it_survives_a_killed_worker_without_running_the_task_twice_at_once(worker, make_dag, tmp_path):
    """kill -9 of the worker mid-task: its task process dies with it (no orphan), the scheduler
    finds the stale heartbeat (worker_lost), and another worker runs the task; never two copies at once."""
    log = tmp_path / "runs.jsonl"
    dag = make_dag([{"task_id": "t", "python_callable": T + "exclusive", "op_kwargs": {"path": str(log), "seconds": 30}}])
    first = worker()
    run = trigger(dag)
    pid = running_pid(run, "t")
    first.kill()
    first.wait(timeout=5)
    wait_until(lambda: gone(pid), timeout=3, message="the task process to die with its worker")
    wait_until(lambda: not live_members(pid), timeout=3, message="its process group to be empty")
    worker()
    ti = settle(run, "t", ("success",), timeout=20)
    lost = ti.attempts.get(attempt_token=1)
    assert lost.kind == "platform"
    assert lost.context["reason"] == "worker_lost"
    assert lost.context["source"] == "scheduler"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["event"] for r in records] == ["start", "start", "end"]
    assert records[0]["pid"] == pid
    assert records[1]["pid"] != pid
    assert records[1]["others_alive"] == []


def test_it_kills_its_task_at_once_when_the_attempt_is_superseded(worker, make_dag):
    """The scheduler gave the task up (here: reported lost by hand) while it still runs: the next
    heartbeat is refused and the worker kills the task's group at once, reporting nothing."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 30}}])
    worker()
    run = trigger(dag)
    pid = running_pid(run, "t")
    ti = instance(run, "t")
    lost = ExecutionContext.of(Reason.WORKER_LOST, Source.SCHEDULER)
    assert reporting.report_failure(ti.pk, ti.attempt_token, lost, expected=(TaskState.RUNNING,))
    wait_until(lambda: gone(pid), timeout=3, message="the superseded task to be killed")
    ti = settle(run, "t", ("success",))
    first = ti.attempts.get(attempt_token=1)
    assert first.context["reason"] == "worker_lost"  # the old worker's view never overwrote it
    assert first.stdout == ""


def _through(proxy: TcpProxy, url: str) -> str:
    """`url` with its host and port replaced by the proxy's."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = (parts.username + "@" if parts.username else "") + f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db.get('USER') or 'postgres'}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the TCP cut needs the database on a socket")
def test_a_database_outage_keeps_tasks_running_and_their_outcomes(worker, make_dag, scheduler_settings, settings, tmp_path):
    """Cut off from the database but not from Redis, a worker keeps its task running on a lease
    in Redis (no scheduler presumes it lost), spools the outcome it cannot report, and delivers
    it when the database is back: the task ran once, nothing is charged to either budget."""
    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    spool = tmp_path / "spool"
    dag = make_dag([{"task_id": "t", "python_callable": T + "window", "op_kwargs": {"path": str(tmp_path / "w"), "seconds": 4}}])
    worker(
        DATABASE_URL=_through(proxy, _database_url()),
        ORCHESTRATOR_HEARTBEAT_TIMEOUT=scheduler_settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT,
        ORCHESTRATOR_REPORT_PATIENCE=1,
        ORCHESTRATOR_SPOOL_DIR=str(spool),
    )
    try:
        run = trigger(dag)
        running_pid(run, "t")
        proxy.cut()
        # Longer than the heartbeat timeout, through the task's end and its spooled report.
        wait_until(lambda: list(spool.glob("*/ti-*.json")), timeout=15, message="the outcome spooled")
        for _ in range(10):
            assert not schedule_once().lost, "a task of a worker cut off only from the database was presumed lost"
        proxy.restore()
        ti = settle(run, "t", ("success", "failed", "up_for_retry", "scheduled"))
        assert (ti.state, ti.try_number, ti.infrastructure_try_number) == ("success", 1, 0)
        assert ti.attempts.count() == 1
        wait_until(lambda: not list(spool.glob("*/ti-*.json")), timeout=5, message="the spool emptied")
    finally:
        proxy.cut()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the TCP cut needs the database on a socket")
def test_a_worker_cut_off_from_database_and_redis_stops_its_task_before_it_is_presumed_lost(
    worker, make_dag, scheduler_settings
):
    """Cut off from both, a worker renews no lease anywhere: it kills its task before any
    scheduler can presume it lost, so the retry elsewhere never runs beside it."""
    db = connection.settings_dict
    db_proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    redis_url = scheduler_settings.REDIS_URL
    from urllib.parse import urlsplit

    redis_parts = urlsplit(redis_url)
    redis_proxy = TcpProxy(redis_parts.hostname or "127.0.0.1", redis_parts.port or 6379)
    dag = make_dag([{"task_id": "t", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 30}}])
    worker(
        DATABASE_URL=_through(db_proxy, _database_url()),
        REDIS_URL=_through(redis_proxy, redis_url),
        ORCHESTRATOR_HEARTBEAT_TIMEOUT=scheduler_settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT,
    )
    try:
        run = trigger(dag)
        pid = running_pid(run, "t")
        db_proxy.cut()
        redis_proxy.cut()

        def presumed_lost() -> bool:
            return bool(schedule_once().lost)

        wait_until(presumed_lost, timeout=10, message="the scheduler to presume the worker lost")
        assert gone(pid), "the task was still running when the scheduler gave it to another worker"
        db_proxy.restore()
        redis_proxy.restore()
        ti = settle(run, "t", ("success",), timeout=30)
        assert ti.attempts.get(attempt_token=1).context["reason"] == "worker_lost"
        assert ti.try_number == 1
    finally:
        db_proxy.cut()
        redis_proxy.cut()


def test_mark_failed_on_a_running_task_stops_it_and_on_kill_hears_why(worker, make_dag, tmp_path):
    """An operator marks a running task failed: at its next heartbeat the worker sends SIGTERM
    with the operator's user_action context (on_kill gets it), and the task stays failed."""
    from django.contrib.auth.models import User

    from orchestrator.operations import actions

    on_kill = tmp_path / "on_kill.json"
    dag = make_dag([{"task_id": "t", "python_callable": T + "GracefulSleeper", "op_kwargs": {"seconds": 60, "on_kill_file": str(on_kill)}}])
    worker()
    run = trigger(dag)
    pid = running_pid(run, "t")
    operator = User.objects.create(username="oncall")
    actions.mark_failed(instance(run, "t"), operator, note="stuck on a lock")
    wait_until(lambda: on_kill.exists(), timeout=10, message="on_kill to run")
    seen = json.loads(on_kill.read_text())
    assert (seen["category"], seen["reason"], seen["metadata"]["note"]) == ("user_action", "manual_mark_failed", "stuck on a lock")
    wait_until(lambda: gone(pid), timeout=10, message="the task process to end")
    ti = instance(run, "t")
    assert ti.state == "failed"
    assert ti.last_failure_context["reason"] == "manual_mark_failed"
    assert ti.attempts.get().state == "failed"
