"""A python task that raises Reschedule: its attempt ends `rescheduled`, charged to neither
budget; it holds no slot while it waits, and runs again with the same try (real workers and a
real scheduler)."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.engine import waits
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import Pool, TaskInstance, TaskWait
from tests.conftest import wait_until
from tests.waits.tasks import read

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

SCHEDULER = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.1"}


def _ti(run, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def test_a_rescheduling_task_frees_its_pool_slot_and_runs_again_with_the_same_try(spawn, worker, make_dag, tmp_path: Path):
    Pool.objects.create(name="one", slots=1)
    log, marker, other_log = tmp_path / "tries.log", tmp_path / "landed", tmp_path / "other.log"
    waiting_dag = make_dag(
        [{"task_id": "sensor", "python_callable": "tests.waits.tasks.reschedule_until",
          "op_kwargs": {"path": str(log), "marker": str(marker), "seconds": 1}, "args": {"pool": "one"}}],
        retries=0,
    )
    other_dag = make_dag(
        [{"task_id": "other", "python_callable": "tests.waits.tasks.record", "op_kwargs": {"path": str(other_log), "seconds": 0.2},
          "args": {"pool": "one"}}]
    )
    waiting_run = create_manual_run(waiting_dag)
    worker()
    spawn("run_scheduler", env=SCHEDULER)
    wait_until(lambda: _ti(waiting_run, "sensor").state == "up_for_reschedule", timeout=30, message="the sensor to reschedule")
    ti = _ti(waiting_run, "sensor")
    assert ti.waiting_for["kind"] == "wait"
    assert ti.waiting_for["name"] == "reschedule"
    assert ti.waiting_for["next_check_at"] is not None
    assert ti.waiting_for["since"]
    first = ti.attempts.order_by("attempt_token").first()
    assert (first.state, first.kind, first.context, first.try_number) == ("rescheduled", "user", None, 1)
    # The only slot of the pool is free while it waits: another task runs meanwhile.
    other_run = create_manual_run(other_dag)
    wait_until(lambda: other_run.refresh_from_db() or other_run.state == "success", timeout=30, message="the other task to run")
    marker.write_text("")
    wait_until(lambda: _ti(waiting_run, "sensor").state == "success", timeout=30, message="the sensor to succeed")
    ti = _ti(waiting_run, "sensor")
    tries = read(str(log))
    assert len(tries) >= 2
    assert {t["try_number"] for t in tries} == {1}
    assert ti.try_number == 1
    assert ti.infrastructure_try_number == 0
    assert ti.result == "landed"
    states = list(ti.attempts.order_by("attempt_token").values_list("state", flat=True))
    assert states[-1] == "success"
    assert set(states[:-1]) == {"rescheduled"}
    # Each rescheduled wait let the other task (which started after the first one) take the slot.
    sensor_runs = [t["at"] for t in tries]
    other = read(str(other_log))[0]
    assert any(a < other["start"] for a in sensor_runs)
    assert any(a > other["end"] for a in sensor_runs)


def test_wait_timeout_fails_a_rescheduling_task_without_retrying_it(spawn, worker, make_dag, tmp_path: Path):
    dag = make_dag(
        [{"task_id": "sensor", "python_callable": "tests.waits.tasks.reschedule_until",
          "op_kwargs": {"path": str(tmp_path / "tries.log"), "marker": str(tmp_path / "never"), "seconds": 0.5}}],
        retries=3,
        wait_timeout=2,
    )
    run = create_manual_run(dag)
    worker()
    spawn("run_scheduler", env=SCHEDULER)
    wait_until(lambda: _ti(run, "sensor").state == "failed", timeout=40, message="the sensor to time out")
    ti = _ti(run, "sensor")
    assert ti.last_failure_context["category"] == "timeout"
    assert ti.last_failure_context["reason"] == "wait_timeout"
    assert ti.try_number == 1  # not retried, though it had retries left
    run.refresh_from_db()
    assert run.state == "failed"


def test_a_due_reschedule_past_its_timeout_fails_at_the_check(make_dag):
    """The scheduler's check: a rescheduled task due after its wait_timeout fails, not dispatched."""
    dag = make_dag([{"task_id": "sensor", "python_callable": "tests.waits.tasks.reschedule_until"}])
    run = create_manual_run(dag)
    ti = _ti(run, "sensor")
    now = run.queued_at
    token = ti.attempt_token + 1
    TaskInstance.objects.filter(pk=ti.pk).update(state="up_for_reschedule", attempt_token=token, try_number=1)
    ti.attempts.create(attempt_token=token, try_number=1, infrastructure_try_number=0, state="rescheduled", queued_at=now)
    TaskWait.objects.create(task_instance=ti, kind="reschedule", attempt_token=token, since=now - timedelta(hours=2),
                            timeout_at=now - timedelta(hours=1), next_check_at=now - timedelta(seconds=1))
    checked = waits.check_due(now)
    assert checked.failed == 1
    ti.refresh_from_db()
    assert ti.state == "failed"
    assert ti.last_failure_context["reason"] == "wait_timeout"
    schedule_once(now)
    assert _ti(run, "sensor").state == "failed"
