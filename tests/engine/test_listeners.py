"""Listener hooks receive every failure's context; a raising listener breaks nothing."""
from __future__ import annotations

import pytest
from django.test import override_settings

from orchestrator import listeners
from orchestrator.engine import reporting
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import TaskInstance
from retries.context import ExecutionContext
from retries.states import Category, Reason, Source
from tests.engine import recording_listener
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = reporting.WorkerInfo(hostname="h", worker_name="w", pid=1)


@override_settings(
    ORCHESTRATOR_LISTENERS=["tests.engine.recording_listener.broken", "tests.engine.recording_listener"],
    ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=0,
)
def test_it_calls_listeners_with_every_context_even_past_a_broken_one():
    """Platform and user failures both reach on_task_instance_failed with their context; poison reaches dead_lettered."""
    recording_listener.calls.clear()
    dag = DagFactory(default_args={"retries": 3, "retry_delay": 0, "poison_threshold": 2})
    TaskFactory(dag=dag, task_id="t")
    run = create_manual_run(dag)
    contexts = [
        (ExecutionContext.of(Reason.WORKER_TERMINATION, Source.WORKER, signal=15), None),
        (ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="KeyError"), "aaaaaaaaaaaa"),
        (ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="KeyError"), "aaaaaaaaaaaa"),
    ]
    for context, fingerprint in contexts:
        ti = TaskInstance.objects.get(dag_run=run)
        assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
        assert reporting.mark_running(ti.pk, ti.attempt_token)
        assert reporting.report_failure(ti.pk, ti.attempt_token, context, fingerprint=fingerprint)
        advance_run(run.pk)
    assert listeners.drain()
    failed = [c for name, c in recording_listener.calls if name == "failed"]
    assert [c["context"].reason for c in failed] == [Reason.WORKER_TERMINATION, Reason.TASK_EXCEPTION, Reason.TASK_EXCEPTION]
    assert failed[0]["context"].category is Category.INFRASTRUCTURE
    assert failed[0]["previous_state"] == "running"
    assert [name for name, _ in recording_listener.calls].count("running") == 3
    (dead,) = [c for name, c in recording_listener.calls if name == "dead_lettered"]
    assert dead["context"].reason is Reason.POISONED
    assert dead["context"].metadata["consecutive_failures"] == 2
    ti = TaskInstance.objects.get(dag_run=run)
    assert ti.state == "dead_letter"
    assert ti.try_number == 2
    assert ti.infrastructure_try_number == 1
    run.refresh_from_db()
    assert run.state == "running"


@override_settings(
    ORCHESTRATOR_LISTENERS=["tests.engine.recording_listener.hanging", "tests.engine.recording_listener"],
    ORCHESTRATOR_LISTENER_TIMEOUT=0.5,
)
def test_a_hanging_listener_holds_up_nothing_and_is_left_behind():
    """The "running" handshake returns at once although a listener hangs in it; past the time
    limit the hung call is left behind and later notifications are delivered."""
    import time

    from tests.engine.recording_listener import Hanging

    recording_listener.calls.clear()
    Hanging.release.clear()
    dag = DagFactory(default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="t")
    run = create_manual_run(dag)
    ti = TaskInstance.objects.get(dag_run=run)
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    started = time.monotonic()
    assert reporting.mark_running(ti.pk, ti.attempt_token)
    assert reporting.report_success(ti.pk, ti.attempt_token)
    assert time.monotonic() - started < 0.4  # neither waited for the hung listener
    time.sleep(0.6)
    assert listeners.drain(timeout=5)  # the hung call was left behind; the rest went through
    assert ("success", {"task_id": "t"}) in recording_listener.calls
    Hanging.release.set()
