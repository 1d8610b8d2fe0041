"""A report whose run cannot be moved on still records the task's end: the advance shares the
report's transaction (no savepoint), so its failure rolls back both, and the report is recorded
again alone; the next scheduler pass moves the run on. A trigger whose run cannot be started
still creates the run, queued, with its audit entry; the next pass starts it."""
from __future__ import annotations

import functools
from contextlib import contextmanager

import pytest
from django.db import connection

from orchestrator.engine import handover, reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import TaskAttempt, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, RunState, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


@contextmanager
def attempts_refused_for(task_instance_id: int | None):
    """The database refuses any new attempt row of this task instance (None: of any), a real
    error, raised by the database inside the dispatch's statement."""
    pg_when = "" if task_instance_id is None else f" WHEN (NEW.task_instance_id = {int(task_instance_id)})"
    sqlite_when = "" if task_instance_id is None else f" WHEN NEW.task_instance_id = {int(task_instance_id)}"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_refuse_attempt() RETURNS trigger AS $$"
                " BEGIN RAISE EXCEPTION 'attempt refused by the test'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER test_refuse_attempt BEFORE INSERT ON orchestrator_taskattempt FOR EACH ROW{pg_when}"
                " EXECUTE FUNCTION test_refuse_attempt()"
            )
        else:
            cursor.execute(
                f"CREATE TRIGGER test_refuse_attempt BEFORE INSERT ON orchestrator_taskattempt{sqlite_when}"
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


def test_a_trigger_creates_its_run_when_the_run_cannot_start(caplog):
    dag = DagFactory(dag_id="start_fails")
    TaskFactory(dag=dag, task_id="a")
    with attempts_refused_for(None):
        run = create_manual_run(dag, triggered_by="alice")
    assert "could not start run" in caplog.text
    run.refresh_from_db()
    assert (run.state, run.start_date) == (RunState.QUEUED, None)
    assert _ti(run, "a").state == TaskState.NONE
    assert not TaskAttempt.objects.filter(task_instance__dag_run=run).exists()
    schedule_once()  # the next pass starts it
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert _ti(run, "a").state == TaskState.QUEUED
