"""A report costs the same whatever the size of its run: only the downstream of the task that
ended is read, and the rest of the run is counted by the database."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.engine import reporting
from orchestrator.engine.runs import create_manual_run
from orchestrator.models import Task, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def fan(width: int, dag_id: str, *, sink_rule: str = "all_success"):
    """root -> `width` tasks in parallel -> sink"""
    dag = DagFactory(dag_id=dag_id)
    TaskFactory(dag=dag, task_id="root")
    middle = [f"m{i}" for i in range(width)]
    Task.objects.bulk_create(
        [Task(dag=dag, task_id=name, bash_command="true", upstream=["root"], position=i + 1) for i, name in enumerate(middle)]
    )
    TaskFactory(dag=dag, task_id="sink", upstream=middle, trigger_rule=sink_rule)
    return dag, middle


def _ti(run, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def _start(ti: TaskInstance) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)


def _queries_of_success(ti: TaskInstance) -> list[str]:
    _start(ti)
    with CaptureQueriesContext(connection) as queries:
        assert reporting.report_success(ti.pk, ti.attempt_token)
    return [q["sql"] for q in queries.captured_queries]



def test_it_reads_no_more_for_a_wide_run_than_for_a_narrow_one():
    """The success of one fan-out task runs the same statements in a 150-wide and a 600-wide run
    (both wider than NEAR_THE_END), and none of them reads the run's task instances whole."""
    counts = []
    for width in (150, 600):
        dag, middle = fan(width, f"fan_{width}")
        run = create_manual_run(dag)
        _start(_ti(run, "root"))
        root = _ti(run, "root")
        assert reporting.report_success(root.pk, root.attempt_token)
        statements = _queries_of_success(_ti(run, middle[0]))
        counts.append(len(statements))
        for statement in statements:
            # every read of task instances is narrowed beyond the run (a state, a task, a LIMIT)
            if "FROM orchestrator_taskinstance ti LEFT JOIN" in statement:
                assert "ti.state" in statement or "ti.task_id IN" in statement, statement
    assert counts[0] == counts[1], counts


def test_the_last_upstream_of_a_fan_in_makes_it_ready_and_the_run_ends():
    """Every middle task's report leaves the sink waiting until the last one; then it runs,
    and the run ends on the sink's report, decided by counts in the database."""
    dag, middle = fan(120, "fan_in")
    run = create_manual_run(dag)
    _start(_ti(run, "root"))
    root = _ti(run, "root")
    assert reporting.report_success(root.pk, root.attempt_token)
    for name in middle[:-1]:
        ti = _ti(run, name)
        _start(ti)
        assert reporting.report_success(ti.pk, ti.attempt_token)
        assert _ti(run, "sink").state == TaskState.NONE
    last = _ti(run, middle[-1])
    _start(last)
    assert reporting.report_success(last.pk, last.attempt_token)
    sink = _ti(run, "sink")
    assert sink.state == TaskState.QUEUED
    _start(sink)
    assert reporting.report_success(sink.pk, sink.attempt_token)
    run.refresh_from_db()
    assert run.state == "success"


def test_a_failure_in_a_wide_fan_in_fails_its_downstream_at_once():
    """all_success: the first middle task that fails for good makes the sink upstream_failed,
    though most of its upstreams are still open; the run fails once the others end."""
    dag, middle = fan(120, "fan_fail")
    run = create_manual_run(dag)
    _start(_ti(run, "root"))
    root = _ti(run, "root")
    assert reporting.report_success(root.pk, root.attempt_token)
    ti = _ti(run, middle[5])
    _start(ti)
    reporting.report_failure(ti.pk, ti.attempt_token, ExecutionContext.of(Reason.NON_RETRYABLE, Source.WORKER))
    assert _ti(run, "sink").state == TaskState.UPSTREAM_FAILED
    for name in middle:
        if name == middle[5]:
            continue
        other = _ti(run, name)
        _start(other)
        assert reporting.report_success(other.pk, other.attempt_token)
    run.refresh_from_db()
    assert run.state == "failed"


def test_one_success_runs_on_the_first_success_of_a_wide_fan_in():
    dag, middle = fan(120, "fan_one", sink_rule="one_success")
    run = create_manual_run(dag)
    _start(_ti(run, "root"))
    root = _ti(run, "root")
    assert reporting.report_success(root.pk, root.attempt_token)
    ti = _ti(run, middle[7])
    _start(ti)
    assert reporting.report_success(ti.pk, ti.attempt_token)
    assert _ti(run, "sink").state == TaskState.QUEUED


def test_a_crowded_fan_in_is_looked_at_once_per_report():
    """A middle task whose sink waits for many other upstreams looks at them once, before its
    end is recorded: so many cannot all be ending with it, so no second look after its commit."""
    dag, middle = fan(150, "fan_crowded")
    run = create_manual_run(dag)
    _start(_ti(run, "root"))
    root = _ti(run, "root")
    assert reporting.report_success(root.pk, root.attempt_token)
    statements = _queries_of_success(_ti(run, middle[0]))
    assert len([s for s in statements if "task_id <>" in s]) == 1, statements
