"""Dispatch, attempt tokens and the conditional state changes that make late reports harmless."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rq import Queue

from orchestrator.engine import reporting
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import TaskInstance, job_id_for
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory, diamond

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _ti(run, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def _run_to_success(ti: TaskInstance) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    assert reporting.report_success(ti.pk, ti.attempt_token, result={"ok": True})


def test_it_dispatches_roots_with_a_job_per_attempt():
    """Triggering queues only the root task, with RQ job id ti-<id>-<token>."""
    run = create_manual_run(diamond())
    a = _ti(run, "a")
    assert a.state == TaskState.QUEUED
    assert a.attempt_token == 1
    assert a.try_number == 1
    assert _ti(run, "b").state == TaskState.NONE
    job_ids = Queue("default", connection=get_redis()).job_ids
    assert job_ids == [job_id_for(a.pk, 1)]
    attempt = a.attempts.get()
    assert (attempt.try_number, attempt.infrastructure_try_number, attempt.state) == (1, 0, "queued")


def test_it_dispatches_downstream_tasks_as_soon_as_upstream_succeeds():
    """A success enqueues ready downstream tasks at once, without a scheduler pass."""
    run = create_manual_run(diamond())
    _run_to_success(_ti(run, "a"))
    assert _ti(run, "b").state == TaskState.QUEUED
    assert _ti(run, "c").state == TaskState.QUEUED
    assert _ti(run, "d").state == TaskState.NONE
    _run_to_success(_ti(run, "b"))
    assert _ti(run, "d").state == TaskState.NONE
    _run_to_success(_ti(run, "c"))
    _run_to_success(_ti(run, "d"))
    run.refresh_from_db()
    assert run.state == "success"
    assert run.end_date is not None


def test_it_ignores_a_report_from_an_older_attempt():
    """After a platform retry re-dispatched the task, the old worker's reports change nothing."""
    dag = DagFactory(default_args={"retries": 2})
    TaskFactory(dag=dag, task_id="only")
    run = create_manual_run(dag)
    ti = _ti(run, "only")
    old_token = ti.attempt_token
    assert reporting.claim(ti.pk, old_token, WORKER)
    assert reporting.mark_running(ti.pk, old_token)
    lost = ExecutionContext.of(Reason.WORKER_LOST, Source.SCHEDULER)
    decision = reporting.report_failure(ti.pk, old_token, lost, now=timezone.now() - timedelta(seconds=60))
    assert decision.next_state is TaskState.SCHEDULED
    advance_run(run.pk)
    ti.refresh_from_db()
    assert ti.state == TaskState.QUEUED
    assert ti.attempt_token == old_token + 1
    assert ti.try_number == 1
    # The presumed-lost worker comes back and reports.
    assert not reporting.heartbeat(ti.pk, old_token)
    assert not reporting.report_success(ti.pk, old_token)
    assert reporting.report_failure(ti.pk, old_token, ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER)) is None
    assert reporting.claim(ti.pk, old_token, WORKER) is None
    ti.refresh_from_db()
    assert ti.state == TaskState.QUEUED
    assert ti.infrastructure_try_number == 1
    kinds = list(ti.attempts.order_by("attempt_token").values_list("kind", "state"))
    assert kinds == [("platform", "failed"), ("user", "queued")]


def test_it_charges_user_retries_and_waits_for_the_backoff():
    """An application failure goes up_for_retry; the next dispatch adds one to try_number."""
    dag = DagFactory(default_args={"retries": 1, "retry_delay": 30, "retry_jitter": "none"})
    TaskFactory(dag=dag, task_id="only")
    run = create_manual_run(dag)
    ti = _ti(run, "only")
    reporting.claim(ti.pk, ti.attempt_token, WORKER)
    reporting.mark_running(ti.pk, ti.attempt_token)
    now = timezone.now()
    boom = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="ValueError")
    decision = reporting.report_failure(ti.pk, ti.attempt_token, boom, fingerprint="abcdefabcdef", now=now)
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.next_retry_at == now + timedelta(seconds=30)
    schedule_once(now + timedelta(seconds=29))
    assert _ti(run, "only").state == TaskState.UP_FOR_RETRY
    schedule_once(now + timedelta(seconds=31))
    ti = _ti(run, "only")
    assert ti.state == TaskState.QUEUED
    assert ti.try_number == 2
    reporting.claim(ti.pk, ti.attempt_token, WORKER)
    reporting.mark_running(ti.pk, ti.attempt_token)
    assert reporting.report_failure(ti.pk, ti.attempt_token, boom, now=now).next_state is TaskState.FAILED
    run.refresh_from_db()
    assert run.state == "failed"
    assert _ti(run, "only").last_failure_context["reason"] == "task_exception"


def test_it_marks_downstream_upstream_failed_and_fails_the_run():
    """When a task fails for good its downstream tasks become upstream_failed and the run fails."""
    run = create_manual_run(diamond())
    a = _ti(run, "a")
    reporting.claim(a.pk, a.attempt_token, WORKER)
    reporting.mark_running(a.pk, a.attempt_token)
    reporting.report_failure(a.pk, a.attempt_token, ExecutionContext.of(Reason.NON_RETRYABLE, Source.WORKER))
    states = dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))
    assert states == {"a": "failed", "b": "upstream_failed", "c": "upstream_failed", "d": "upstream_failed"}
    run.refresh_from_db()
    assert run.state == "failed"


def test_it_leaves_runs_with_nothing_to_do_unlocked():
    """The scheduler's pass picks only runs it would change: queued, due, ready or complete."""
    from orchestrator.engine.scheduler import runs_needing_work

    waiting = create_manual_run(diamond("waiting"))  # a is queued on a worker: nothing to do
    ready = create_manual_run(diamond("ready"))
    a = _ti(ready, "a")
    reporting.claim(a.pk, a.attempt_token, WORKER)
    reporting.mark_running(a.pk, a.attempt_token)
    # Succeeds without its worker advancing the run (as if that worker died right after).
    TaskInstance.objects.filter(pk=a.pk).update(state=TaskState.SUCCESS)
    retrying = create_manual_run(diamond("retrying"))
    TaskInstance.objects.filter(dag_run=retrying, task_id="a").update(
        state=TaskState.UP_FOR_RETRY, next_retry_at=timezone.now() + timedelta(minutes=5)
    )
    now = timezone.now()
    assert runs_needing_work(now) == [ready.pk]
    assert runs_needing_work(now + timedelta(minutes=6)) == sorted([ready.pk, retrying.pk])
    schedule_once(now)
    assert {_ti(ready, "b").state, _ti(ready, "c").state} == {TaskState.QUEUED}
    assert waiting.pk not in runs_needing_work(now)


@pytest.mark.django_db(transaction=True)
def test_a_dispatch_redis_refuses_is_undone_and_charges_nothing(settings):
    """Redis unreachable when a run is triggered: the run is created, the task waits as it was
    (no try spent, no attempt row, no queued timeout to sit out) and the next scheduler pass
    dispatches it once Redis answers."""
    from orchestrator.engine.run_creation import create_manual_run
    from orchestrator.models import TaskAttempt

    dag = DagFactory()
    TaskFactory(dag=dag, task_id="t")
    reachable = settings.REDIS_URL
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    run = create_manual_run(dag)
    ti = TaskInstance.objects.get(dag_run=run)
    assert (ti.state, ti.try_number, ti.attempt_token) == ("scheduled", 0, 1)
    assert not TaskAttempt.objects.filter(task_instance=ti).exists()
    settings.REDIS_URL = reachable
    schedule_once()
    ti.refresh_from_db()
    assert (ti.state, ti.try_number, ti.attempt_token) == ("queued", 1, 2)
    assert TaskAttempt.objects.filter(task_instance=ti).count() == 1


def test_the_run_ends_when_its_last_two_tasks_end_at_once(monkeypatch):
    """Each of the last two tasks of a fan-out reads the other unfinished before it records its
    own end; the one that records last still ends the run, with no scheduler pass."""
    dag = DagFactory(dag_id="two_leaves")
    TaskFactory(dag=dag, task_id="a", upstream=[])
    TaskFactory(dag=dag, task_id="b", upstream=[])
    run = create_manual_run(dag)
    a, b = _ti(run, "a"), _ti(run, "b")
    for ti in (a, b):
        assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
        assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    read_by_b = reporting._Ended.read(b.pk)  # b's report reads before a's is recorded
    assert read_by_b.unfinished_others == 1
    assert reporting.report_success(a.pk, a.attempt_token)
    run.refresh_from_db()
    assert run.state == "running"
    monkeypatch.setattr(reporting._Ended, "read", classmethod(lambda cls, pk: read_by_b))
    assert reporting.report_success(b.pk, b.attempt_token)
    run.refresh_from_db()
    assert run.state == "success"
    assert run.end_date is not None



def test_a_batch_dispatch_skips_the_task_that_changed_since_it_was_read():
    """Many tasks are dispatched in one statement, each fenced by the token and state it was
    read with: one that changed meanwhile (a clear takes a new token) is left alone; the others
    go, each with one attempt row and one job."""
    from orchestrator.engine.dispatch import dispatch_many
    from orchestrator.engine.run_creation import create_run
    from orchestrator.engine.transitions import transition

    dag = DagFactory(dag_id="batch")
    for name in ("a", "b", "c"):
        TaskFactory(dag=dag, task_id=name, upstream=[])
    run = create_run(dag, run_type="manual", logical_date=timezone.now())
    TaskInstance.objects.filter(dag_run=run).update(state=TaskState.SCHEDULED)
    read = list(TaskInstance.objects.filter(dag_run=run).order_by("task_id"))
    b = read[1]
    assert transition(b.pk, expected=[TaskState.SCHEDULED], token=b.attempt_token, attempt_token=b.attempt_token + 1)
    assert dispatch_many(read, timezone.now()) == 2
    after = {ti.task_id: ti for ti in TaskInstance.objects.filter(dag_run=run)}
    assert (after["a"].state, after["a"].attempt_token, after["a"].try_number) == (TaskState.QUEUED, 1, 1)
    assert (after["c"].state, after["c"].attempt_token, after["c"].try_number) == (TaskState.QUEUED, 1, 1)
    assert (after["b"].state, after["b"].attempt_token, after["b"].try_number) == (TaskState.SCHEDULED, 1, 0)
    assert not after["b"].attempts.exists()
    assert Queue("default", connection=get_redis()).job_ids == [job_id_for(after["a"].pk, 1), job_id_for(after["c"].pk, 1)]


def test_a_platform_retry_repeats_the_try_in_a_batch_dispatch():
    """The try arithmetic of a batch dispatch: a user try adds one, a platform retry does not."""
    from orchestrator.engine.dispatch import dispatch_many
    from orchestrator.engine.run_creation import create_run

    dag = DagFactory(dag_id="tries")
    for name in ("user", "platform"):
        TaskFactory(dag=dag, task_id=name, upstream=[])
    run = create_run(dag, run_type="manual", logical_date=timezone.now())
    TaskInstance.objects.filter(dag_run=run).update(state=TaskState.UP_FOR_RETRY, try_number=2, attempt_token=2, pre_execution_tries=1)
    TaskInstance.objects.filter(dag_run=run, task_id="platform").update(retry_is_platform=True)
    assert dispatch_many(list(TaskInstance.objects.filter(dag_run=run)), timezone.now()) == 2
    after = {ti.task_id: ti for ti in TaskInstance.objects.filter(dag_run=run)}
    assert (after["user"].try_number, after["user"].pre_execution_tries, after["user"].attempt_token) == (3, 0, 3)
    assert (after["platform"].try_number, after["platform"].pre_execution_tries, after["platform"].attempt_token) == (2, 1, 3)
    assert not after["platform"].retry_is_platform
