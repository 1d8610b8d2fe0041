"""A report costs the same whatever the size of its run: only the downstream of the task that
ended is read, and the rest of the run is counted by the database."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import Task, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue", "caches_held")]

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


def _statements(call) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert call()
    return [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT") and "SAVEPOINT" not in q["sql"]]


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the statement counts are PostgreSQL's")
def test_a_chains_step_costs_a_fixed_few_statements():
    """From one task of a chain to the next: the report reads nothing it already knows (the
    ended task's state, the next one's only upstream), counts no outcome while a task is due,
    and writes the next attempt's row with its dispatch; the claim reads what the attempt runs,
    its task state and its start deadlines with its move; the handshake reads nothing."""
    dag = DagFactory(dag_id="chain_cost")
    for i in range(3):
        TaskFactory(dag=dag, task_id=f"t{i}", upstream=[f"t{i - 1}"] if i else [])
    run = create_manual_run(dag)
    first = _ti(run, "t0")
    _start(first)
    assert reporting.report_success(first.pk, first.attempt_token)  # the DAG's edges are read once
    second = _ti(run, "t1")
    _start(second)
    report = _statements(lambda: reporting.report_success(second.pk, second.attempt_token))
    # Read the ended task; move it; lock the run; read the next one (and anything due);
    # dispatch it from `none` (its `scheduled` never written) with its attempt row and whether
    # it has queued deadlines to create.
    assert len(report) == 5, "\n".join(s[:90] for s in report)
    third = _ti(run, "t2")
    assert third.state == TaskState.QUEUED
    assert third.attempts.get().state == "queued"
    claimed: list = []
    claim = _statements(lambda: claimed.append(reporting.claim(third.pk, third.attempt_token, WORKER)) or claimed[0])
    assert len(claim) == 2, claim  # the move with what it runs; its upstream's result
    assert claimed[0].has_start_deadlines is False
    assert claimed[0].has_task_state is False
    assert claimed[0].results == {"t1": None}
    in_autocommit: list[bool] = []

    def note_autocommit(execute, sql, params, many, context):
        in_autocommit.append(context["connection"].get_autocommit())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(note_autocommit):
        handshake = _statements(
            lambda: reporting.mark_running(third.pk, third.attempt_token, pid=1, has_start_deadlines=claimed[0].has_start_deadlines)
        )
    assert len(handshake) == 1, handshake
    # ... which commits as it runs: no BEGIN and COMMIT round trips around it.
    assert in_autocommit == [True]


def test_the_claim_says_what_the_handshake_must_create_and_the_handshake_creates_it():
    """A task with a task_started_at deadline: its claim says so, and the handshake that takes
    the claim's word for it creates the deadline in its own transaction; a task without one
    creates none. Task state stored by an earlier attempt is seen by the claim too."""
    from deadlines.models import Deadline, DeadlineDefinition
    from orchestrator.engine import task_state_store
    from orchestrator.models import TaskStateEntry

    dag = DagFactory(dag_id="start_deadlines")
    watched = TaskFactory(dag=dag, task_id="watched")
    TaskFactory(dag=dag, task_id="plain")
    TaskFactory(dag=dag, task_id="resumed")
    DeadlineDefinition.objects.create(dag=dag, task=watched, reference="task_started_at", interval=300, callback="notifier:log")
    run = create_manual_run(dag)
    for task_id, expected in (("watched", True), ("plain", False)):
        ti = _ti(run, task_id)
        claimed = reporting.claim(ti.pk, ti.attempt_token, WORKER)
        assert claimed is not None
        assert claimed.has_start_deadlines is expected
        assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1, has_start_deadlines=claimed.has_start_deadlines)
        assert Deadline.objects.filter(task_instance=ti).exists() is expected
        # No task state stored: the start needs no read, and is the start a read would give.
        started = task_state_store.start_claimed(ti.pk, dag.dag_id, run.run_id, task_id, claimed.task_state_epoch, claimed.has_task_state)
        assert started == task_state_store.start(ti.pk, dag.dag_id, run.run_id, task_id)

    # A task whose earlier attempt stored task state (as a retry of it would find it).
    resumed = _ti(run, "resumed")
    TaskStateEntry.objects.create(
        task_instance=resumed, key="cursor", value=7, written_at=resumed.queued_at, attempt_token=resumed.attempt_token,
        try_number=resumed.try_number, infrastructure_try_number=resumed.infrastructure_try_number,
    )
    claimed = reporting.claim(resumed.pk, resumed.attempt_token, WORKER)
    assert claimed is not None
    assert claimed.has_task_state is True
    assert task_state_store.start_claimed(resumed.pk, dag.dag_id, run.run_id, "resumed", claimed.task_state_epoch, True) is None
    assert task_state_store.start(resumed.pk, dag.dag_id, run.run_id, "resumed").entries == {"cursor": 7}
    fresh = reporting.claim(_ti(run, "plain").pk, 0, WORKER)  # already claimed: stale, no second move
    assert fresh is None


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
