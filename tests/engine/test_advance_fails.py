"""A report whose run cannot be moved on still records the task's end: the advance shares the
report's transaction (no savepoint), so its failure rolls back both, and the report is recorded
again alone; the next scheduler pass moves the run on."""
from __future__ import annotations

import functools
from contextlib import contextmanager

import pytest
from django.db import connection

from orchestrator.engine import handover, reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


@contextmanager
def attempts_refused_for(task_instance_id: int):
    """The database refuses any new attempt row of this task instance (a real error, raised by
    the database inside the dispatch's statement)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_refuse_attempt() RETURNS trigger AS $$"
                " BEGIN RAISE EXCEPTION 'attempt refused by the test'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER test_refuse_attempt BEFORE INSERT ON orchestrator_taskattempt FOR EACH ROW"
                f" WHEN (NEW.task_instance_id = {int(task_instance_id)}) EXECUTE FUNCTION test_refuse_attempt()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER test_refuse_attempt BEFORE INSERT ON orchestrator_taskattempt"
                f" WHEN NEW.task_instance_id = {int(task_instance_id)}"
                " BEGIN SELECT RAISE(ABORT, 'attempt refused by the test'); END"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("DROP TRIGGER test_refuse_attempt ON orchestrator_taskattempt")
                cursor.execute("DROP FUNCTION test_refuse_attempt()")
            else:
                cursor.execute("DROP TRIGGER test_refuse_attempt")


def _ti(run, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def _chain(dag_id: str):
    dag = DagFactory(dag_id=dag_id)
    TaskFactory(dag=dag, task_id="a", args={"retries": 0})
    TaskFactory(dag=dag, task_id="b", upstream=["a"], trigger_rule="all_done")
    run = create_manual_run(dag)
    a = _ti(run, "a")
    assert reporting.claim(a.pk, a.attempt_token, WORKER)
    assert reporting.mark_running(a.pk, a.attempt_token, pid=1)
    return run, a


def test_a_success_is_recorded_when_its_run_cannot_move_on(caplog):
    run, a = _chain("advance_fails_success")
    offer = handover.Offer(lambda: frozenset({"default"}), functools.partial(reporting.claim_within, worker=WORKER))
    with attempts_refused_for(_ti(run, "b").pk), handover.offering(offer):
        assert reporting.report_success(a.pk, a.attempt_token, result=7)
    a = _ti(run, "a")
    assert (a.state, a.result) == (TaskState.SUCCESS, 7)
    assert a.attempts.get().state == "success"
    b = _ti(run, "b")
    assert b.state == TaskState.NONE
    assert not b.attempts.exists()
    assert offer.taken is None
    assert "could not advance run" in caplog.text
    schedule_once()  # the next pass moves the run on
    assert _ti(run, "b").state == TaskState.QUEUED


def test_a_failure_is_recorded_when_its_run_cannot_move_on(caplog):
    run, a = _chain("advance_fails_failure")
    with attempts_refused_for(_ti(run, "b").pk):
        decision = reporting.report_failure(a.pk, a.attempt_token, ExecutionContext.of(Reason.NON_RETRYABLE, Source.WORKER))
    assert decision is not None
    assert decision.next_state is TaskState.FAILED
    a = _ti(run, "a")
    assert a.state == TaskState.FAILED
    assert a.attempts.get().state == "failed"
    assert _ti(run, "b").state == TaskState.NONE
    assert "could not advance run" in caplog.text
    schedule_once()
    assert _ti(run, "b").state == TaskState.QUEUED  # all_done: it runs after a failure too
