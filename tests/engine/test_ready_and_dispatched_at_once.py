"""A task a report makes ready, with nothing but its fence to pass, goes from `none` to `queued`
in the dispatch's one statement; whatever is not dispatched after all is written `scheduled`."""
from __future__ import annotations

import pytest
from django.utils import timezone
from rq import Queue

from orchestrator.engine import reporting, run_settling
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import Circuit, Task, TaskAttempt, TaskInstance
from retries.states import TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _ti(run, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def _root_done(dag) -> tuple:
    run = create_manual_run(dag)
    root = _ti(run, "root")
    assert reporting.claim(root.pk, root.attempt_token, WORKER)
    assert reporting.mark_running(root.pk, root.attempt_token, pid=1)
    Queue("default", connection=get_redis()).empty()
    assert reporting.report_success(root.pk, root.attempt_token)
    return run


def test_a_wide_fan_out_made_ready_by_a_report_is_dispatched_once_each():
    """250 tasks made ready by one report: the first chunk goes with it, the rest after its
    commit, each chunk from `none`; each exactly once, none left behind in `none`."""
    dag = DagFactory(dag_id="wide_from_report")
    TaskFactory(dag=dag, task_id="root")
    Task.objects.bulk_create(
        [Task(dag=dag, task_id=f"m{i:03d}", bash_command="true", upstream=["root"], position=i + 1) for i in range(250)]
    )
    run = _root_done(dag)
    middle = TaskInstance.objects.filter(dag_run=run).exclude(task_id="root")
    assert {(ti.state, ti.attempt_token, ti.try_number) for ti in middle} == {(TaskState.QUEUED, 1, 1)}
    assert TaskAttempt.objects.filter(task_instance__in=middle).count() == 250
    assert Queue("default", connection=get_redis()).count == 250


def test_a_task_behind_a_circuit_is_written_scheduled_and_held():
    """A gated task is settled as always (written `scheduled`), then held with what holds it."""
    Circuit.objects.create(name="api", state="open", opened_at=timezone.now(), cooldown=600)
    dag = DagFactory(dag_id="gated_next")
    TaskFactory(dag=dag, task_id="root")
    TaskFactory(dag=dag, task_id="call", upstream=["root"], args={"circuit": "api"})
    run = _root_done(dag)
    call = _ti(run, "call")
    assert call.state == TaskState.SCHEDULED
    assert (call.waiting_for or {}).get("kind") == "circuit"


def test_a_ready_task_not_dispatched_after_all_is_written_scheduled(monkeypatch):
    """Were a gate to close between the choice and the dispatch, the task made ready in memory
    only must not stay `none`: it is written `scheduled` before the commit, for the next pass."""
    Circuit.objects.create(name="api", state="open", opened_at=timezone.now(), cooldown=600)
    monkeypatch.setattr(run_settling, "_dispatched_at_once", lambda run, now, ti: True)  # as if it was closed when chosen
    dag = DagFactory(dag_id="gate_closed_meanwhile")
    TaskFactory(dag=dag, task_id="root")
    TaskFactory(dag=dag, task_id="call", upstream=["root"], args={"circuit": "api"})
    run = _root_done(dag)
    call = _ti(run, "call")
    assert call.state == TaskState.SCHEDULED
    assert call.attempt_token == 0
    assert not call.attempts.exists()
    assert Queue("default", connection=get_redis()).count == 0
