"""A database outage on the clock and the scheduler: shared_now() keeps its last offset instead
of raising, a scheduler whose database is away keeps running, and a scheduler started after an
outage (another process, or this one restarted) still waits one heartbeat timeout before it
presumes a task lost."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from orchestrator.engine.scheduler import _Reconnection
from orchestrator.foundation import clock
from orchestrator.models import TaskInstance
from tests.conftest import wait_until
from tests.worker.proxy import TcpProxy
from tests.worker.test_supervisor import _database_url, _through

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cuttable_database():
    """This process's database connection through a proxy the test can cut (and always restores)."""
    db = connection.settings_dict
    original = (db.get("HOST"), db.get("PORT"))
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    connection.close()
    db["HOST"], db["PORT"] = "127.0.0.1", str(proxy.port)
    try:
        yield proxy
    finally:
        connection.close()
        db["HOST"], db["PORT"] = original
        proxy.cut()


def test_shared_now_keeps_its_last_offset_while_the_database_is_away(cuttable_database, settings):
    """A machine an hour slow measured its offset; the database goes away and the offset is due
    again: shared_now() still answers, on the database's time, and does not try on every call."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's clock is this machine's")
    settings.ORCHESTRATOR_CLOCK_SKEW = -3600
    clock._offset = None
    measured = clock.shared_now()
    assert abs((measured - timezone.now()).total_seconds()) < 5  # corrected by +1 h
    cuttable_database.cut()
    connection.close()
    clock._offset = (clock._offset[0] - clock.OFFSET_TTL - 1, clock._offset[1])  # due again
    started = time.monotonic()
    during = [clock.shared_now() for _ in range(50)]
    assert time.monotonic() - started < 5  # one failed try, then the old offset until OFFSET_RETRY
    assert all(abs((now - timezone.now()).total_seconds()) < 5 for now in during)
    cuttable_database.restore()
    clock._offset = None


def test_shared_now_answers_with_no_database_ever_reached(cuttable_database):
    cuttable_database.cut()
    connection.close()
    clock._offset = None
    try:
        assert abs((clock.shared_now() - timezone.now()).total_seconds()) < 5
    finally:
        clock._offset = None


def test_a_noted_outage_holds_lost_detection_for_one_heartbeat_timeout_in_any_process(settings):
    """Kept in Redis: a scheduler that did not see the outage itself still waits."""
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT = 30
    now = timezone.now()
    assert _Reconnection.may_presume_lost(now)
    _Reconnection.note_outage()
    assert not _Reconnection.may_presume_lost(now)  # the first pass back turns it into a wait
    assert not _Reconnection.may_presume_lost(now + timedelta(seconds=29))
    assert _Reconnection.may_presume_lost(now + timedelta(seconds=30))


@pytest.mark.integration
def test_a_scheduler_survives_an_outage_and_its_successor_still_waits(spawn, settings):
    """A scheduler started while the database is away keeps running (its passes fail, it does
    not die); killed and replaced once the database is back, the new one waits one heartbeat
    timeout before it calls a silent running task lost."""
    import threading

    from orchestrator.engine.run_creation import create_manual_run
    from tests.engine.factories import DagFactory, TaskFactory

    silent_dag, marker_dag = DagFactory(dag_id="silent"), DagFactory(dag_id="marker")
    TaskFactory(dag=silent_dag, task_id="t", bash_command="true")
    TaskFactory(dag=marker_dag, task_id="m", bash_command="true")
    run = create_manual_run(silent_dag)
    stale = timezone.now() - timedelta(minutes=5)
    ti = TaskInstance.objects.get(dag_run=run)
    token = ti.attempt_token or 1
    TaskInstance.objects.filter(pk=ti.pk).update(state="running", attempt_token=token, heartbeat_at=stale, worker_name="w", hostname="h")
    ti.attempts.update_or_create(
        attempt_token=token, defaults={"try_number": 1, "infrastructure_try_number": 0, "queued_at": stale, "state": "running"}
    )
    # A task only a scheduler pass dispatches: when its token moves, the new scheduler has passed.
    marker = TaskInstance.objects.get(dag_run=create_manual_run(marker_dag))
    TaskInstance.objects.filter(pk=marker.pk).update(state="scheduled", next_retry_at=stale)
    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    proxy.cut()
    timeout = 10
    env = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.1", "ORCHESTRATOR_HEARTBEAT_TIMEOUT": str(timeout)}
    try:
        first = spawn("run_scheduler", env={**env, "DATABASE_URL": _through(proxy, _database_url())})
        output: list[str] = []
        threading.Thread(target=lambda: output.extend(first.stdout), daemon=True).start()
        wait_until(lambda: first.poll() is not None or sum("unreachable" in line for line in output) >= 10,
                   timeout=90, message="the first scheduler's passes to meet the outage")  # fmt: skip
        assert first.poll() is None, "".join(output[-40:])
        first.kill()
        first.wait(timeout=10)
        second = spawn("run_scheduler", env=env)
        wait_until(lambda: TaskInstance.objects.get(pk=marker.pk).state == "queued", timeout=90, message="a pass of the new scheduler")
        passed = time.monotonic()
        time.sleep(2)
        assert TaskInstance.objects.get(dag_run=run).state == "running", "presumed lost right after the outage"

        def lost() -> bool:
            return TaskInstance.objects.get(dag_run=run).state != "running"

        wait_until(lost, timeout=60, message="the silent task presumed lost once the wait is over")
        assert time.monotonic() - passed >= timeout - 1
        attempt = TaskInstance.objects.get(dag_run=run).attempts.get(attempt_token=token)
        assert attempt.context["reason"] == "worker_lost"
        assert second.poll() is None
    finally:
        proxy.cut()
