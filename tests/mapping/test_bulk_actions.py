"""An action on every instance of a mapped task is one set-based change: one transaction (all or
nothing), each instance audited, and a number of statements that does not grow with the number
of instances; its effects are those of the action on each instance."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.engine import reporting, task_state_store
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.exceptions import Conflict
from orchestrator.models import AuditLog, DagRun, TaskAttempt, TaskInstance, TaskStateEntry
from orchestrator.operations import actions
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _fail(ti: TaskInstance) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="ValueError")
    assert reporting.report_failure(ti.pk, ti.attempt_token, context, fingerprint="abcabcabcabc")


def _failed_run(dag_id: str, n: int, *, retries: int = 1) -> DagRun:
    """each over n items, every instance failed for good; report after it (upstream_failed)."""
    dag = DagFactory(dag_id=dag_id, default_args={"retries": retries, "retry_delay": 0})
    TaskFactory(dag=dag, task_id="each", expand={"item": list(range(n))})
    TaskFactory(dag=dag, task_id="report", upstream=["each"])
    run = create_manual_run(dag)
    for _ in range(retries + 1):
        advance_run(run.pk)
        for ti in TaskInstance.objects.filter(dag_run=run, task_id="each", state=TaskState.QUEUED):
            _fail(ti)
    assert DagRun.objects.get(pk=run.pk).state == "failed"
    return run


def _instances(run: DagRun) -> list[TaskInstance]:
    return actions.find_task_instances(run.dag.dag_id, run.run_id, "each")


def test_clearing_every_instance_is_all_or_nothing(alice):
    run = _failed_run("all_or_nothing", 5)
    instances = _instances(run)
    # One instance changes after it was read (as a dispatch would): nothing may be cleared.
    TaskInstance.objects.filter(pk=instances[3].pk).update(attempt_token=instances[3].attempt_token + 1)
    with pytest.raises(Conflict):
        actions.act_on_task("clear", instances, alice, note="all of them")
    assert set(TaskInstance.objects.filter(dag_run=run, task_id="each").values_list("state", flat=True)) == {"failed"}
    assert not AuditLog.objects.exists()
    assert DagRun.objects.get(pk=run.pk).state == "failed"


def test_clearing_every_instance_has_each_effect_of_a_clear_and_audits_each(alice):
    run = _failed_run("effects", 4)
    ids = [ti.pk for ti in _instances(run)]
    TaskStateEntry.objects.bulk_create([
        TaskStateEntry(task_instance_id=pk, key="k", value=1, written_at=run.queued_at, attempt_token=1, try_number=1,
                       infrastructure_try_number=0) for pk in ids
    ])
    entries = actions.act_on_task("clear", _instances(run), alice, note="again")
    assert len(entries) == 4
    audited = AuditLog.objects.filter(action="clear").order_by("id")
    assert [(e.details["map_index"], e.prior_state, e.new_state, e.details["note"]) for e in audited] == [
        (i, "failed", "none", "again") for i in range(4)
    ]
    for ti in TaskInstance.objects.filter(pk__in=ids):
        assert ti.max_tries == 2 + 1 + 1  # the try_number it was cleared at + retries + 1
        assert ti.last_failure_context["reason"] == "manual_clear"
        assert ti.task_state_epoch == 1
        assert ti.state in (TaskState.QUEUED, TaskState.SCHEDULED)
    assert not TaskStateEntry.objects.exists()
    assert task_state_store.of_instances(ids) == {}
    assert TaskInstance.objects.get(dag_run=run, task_id="report").state == TaskState.NONE
    assert DagRun.objects.get(pk=run.pk).state == "running"


def test_marking_every_queued_instance_failed_stops_each(alice):
    dag = DagFactory(dag_id="stop_all", default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="each", expand={"item": [1, 2, 3]})
    run = create_manual_run(dag)
    advance_run(run.pk)
    instances = _instances(run)
    assert {ti.state for ti in instances} == {TaskState.QUEUED}
    actions.act_on_task("mark_failed", instances, alice, note="stop")
    for ti in TaskInstance.objects.filter(dag_run=run):
        assert ti.state == TaskState.FAILED
        assert ti.last_failure_context["metadata"]["stop"] is True
        (attempt,) = TaskAttempt.objects.filter(task_instance=ti)
        assert attempt.state == "failed"
        assert attempt.context["reason"] == "manual_mark_failed"
    assert [e.details["stopped"] for e in AuditLog.objects.filter(action="mark_failed")] == [True] * 3
    assert DagRun.objects.get(pk=run.pk).state == "failed"


def test_marking_every_instance_success_lets_the_downstream_run(alice):
    run = _failed_run("success_all", 3, retries=0)
    actions.act_on_task("mark_success", _instances(run), alice)
    assert set(TaskInstance.objects.filter(dag_run=run, task_id="each").values_list("state", flat=True)) == {"success"}
    assert TaskInstance.objects.get(dag_run=run, task_id="report").state == TaskState.QUEUED
    assert AuditLog.objects.filter(action="mark_success").count() == 3


@pytest.mark.parametrize("action", ["clear", "mark_success", "mark_failed"])
def test_an_action_on_every_instance_costs_the_same_statements_for_10_or_80(alice, action):
    def statements(n: int) -> int:
        run = _failed_run(f"cost_{action}_{n}", n, retries=0)
        instances = _instances(run)
        if action == "mark_failed":
            TaskInstance.objects.filter(dag_run=run, task_id="each").update(state=TaskState.UP_FOR_RETRY)
            instances = _instances(run)
        with CaptureQueriesContext(connection) as queries:
            assert len(actions.act_on_task(action, instances, alice)) == n
        return len(queries)

    assert statements(80) <= statements(10) + 2  # (a lazy read or two may fall either side)
