"""On PostgreSQL an attempt's moves (claim, handshake, report) and a report's reads (of the task
it ends, of the few it may make ready) are prepared statements, planned once per connection;
other reads of a run's tasks are not. A plan kept from when the tables were tiny would read
them through as they grow: a run that outgrows their statistics analyzes them. Fencing is the
same either way."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue", "caches_held")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE from_sql = false")
        return [statement for (statement,) in cursor.fetchall()]


def _chain():
    dag = DagFactory(dag_id="prepared_chain")
    TaskFactory(dag=dag, task_id="a")
    TaskFactory(dag=dag, task_id="b", upstream=["a"])
    run = create_manual_run(dag)
    return run, TaskInstance.objects.get(dag_run=run, task_id="a")


@pytest.fixture
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    connection.close()  # a connection of its own: its prepared statements are this test's


def test_an_attempts_moves_and_its_reports_reads_are_prepared_and_other_run_reads_are_not(postgresql_only):
    run, ti = _chain()
    with CaptureQueriesContext(connection) as queries:
        assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
        assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
        assert reporting.report_success(ti.pk, ti.attempt_token, result={"rows": 3})
    prepared = _prepared()
    moves = [statement for statement in prepared if statement.startswith("WITH moved AS")]
    # claim, handshake and success: three statements, each with its values bound apart
    assert len(moves) == 3, prepared
    assert all("$1" in statement for statement in moves)
    # The read of the task a report ends, by its key, is prepared too ...
    assert [statement for statement in prepared if "FROM orchestrator_taskinstance ti" in statement and "WHERE ti.id = $1" in statement]
    # ... and so is its read of the next task (with whatever else of the run is due); no read of
    # a run's tasks that is not a report's is.
    run_reads = [statement for statement in prepared if "dag_run_id = $" in statement and "WITH moved" not in statement]
    assert len(run_reads) == 1, prepared
    assert "ti.task_id IN ($2)" in run_reads[0], prepared
    # The query log still shows what a prepared statement ran.
    assert sum("WITH moved AS" in (query["sql"] or "") for query in queries.captured_queries) == 3
    ti.refresh_from_db()
    assert (ti.state, ti.result) == ("success", {"rows": 3})
    assert TaskInstance.objects.get(dag_run=run, task_id="b").state == "queued"


def test_a_prepared_move_is_still_fenced(postgresql_only):
    """A stale token loses against a prepared move as against any: nothing changes."""
    _, ti = _chain()
    token = ti.attempt_token
    assert reporting.claim(ti.pk, token, WORKER)
    assert reporting.claim(ti.pk, token + 1, WORKER) is None  # a token that is not current
    assert not reporting.mark_running(ti.pk, token + 1, pid=1)
    assert reporting.mark_running(ti.pk, token, pid=1)
    assert not reporting.report_success(ti.pk, token + 1)
    ti.refresh_from_db()
    assert ti.state == "running"
    assert ti.result is None


@override_settings(ORCHESTRATOR_DB_PREPARED_STATEMENTS=False)
def test_nothing_is_prepared_when_turned_off(postgresql_only):
    _, ti = _chain()
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    assert _prepared() == []


def _session(**options):
    """A connection of its own to the test database (as a worker's or another process's)."""
    import psycopg

    params = connection.get_connection_params()
    for libpq_unknown in ("cursor_factory", "prepare_threshold"):
        params.pop(libpq_unknown, None)
    return psycopg.connect(**params, **options)


def _plan(session, execute: str) -> str:
    """The plan `session` keeps for a prepared statement, as EXPLAIN shows it."""
    return "\n".join(row[0] for row in session.execute(f"EXPLAIN {execute}").fetchall())


def test_a_big_run_makes_every_session_plan_its_moves_for_the_table_it_grew(postgresql_only):
    """A move prepared while the table was tiny is planned as a read of the whole table, and
    PostgreSQL keeps that plan until the table's statistics change. Creating a run of more
    tasks than the statistics know of analyzes the table once committed: a worker's session
    then plans its moves on the key again, without waiting for autovacuum."""

    from orchestrator.models import Task

    run, ti = _chain()
    with _session(autocommit=True) as worker_session:
        worker_session.execute("ANALYZE orchestrator_taskinstance")  # statistics of a tiny table
        worker_session.execute(
            "PREPARE move(bigint, bigint) AS WITH moved AS (UPDATE orchestrator_taskinstance SET heartbeat_at = now()"
            " WHERE id = $1 AND state IN ('running') AND attempt_token = $2 RETURNING id) SELECT count(*) FROM moved"
        )
        for _ in range(8):  # past its first custom plans: the plan kept is the generic one
            worker_session.execute(f"EXECUTE move({ti.pk}, {ti.attempt_token})")
        assert "Seq Scan on orchestrator_taskinstance" in _plan(worker_session, f"EXECUTE move({ti.pk}, {ti.attempt_token})")  # the premise

        dag = DagFactory(dag_id="big")
        Task.objects.bulk_create([Task(dag=dag, task_id=f"t{i:04d}", bash_command="true", position=i) for i in range(1500)])
        create_manual_run(dag)

        plan = _plan(worker_session, f"EXECUTE move({ti.pk}, {ti.attempt_token})")
        assert "Seq Scan" not in plan, plan
        assert "orchestrator_taskinstance_pkey" in plan, plan


def test_only_rows_the_statistics_do_not_know_of_call_for_an_analyze():
    from orchestrator.engine.tablestats import ANALYZE_FROM_ROWS, needs_analyze

    assert needs_analyze(ANALYZE_FROM_ROWS, -1)  # never analyzed
    assert needs_analyze(10_000, 33)
    assert not needs_analyze(10_000, 1_000_000)  # a year of history: its plans are already right
    assert not needs_analyze(ANALYZE_FROM_ROWS - 1, 0)  # too few to make a plan go far wrong


def test_the_ended_tasks_read_planned_once_finds_the_runs_unfinished_tasks_by_their_index(postgresql_only):
    """The read a success report starts with is prepared: its plan, made once for any task,
    reaches the task by its key and counts the run's unfinished tasks through their partial
    index (the states are written into it), not through the run's every row."""

    from orchestrator.engine.reporting import _ENDED_READ
    from orchestrator.models import Task

    dag = DagFactory(dag_id="wide")
    Task.objects.bulk_create([Task(dag=dag, task_id=f"t{i:04d}", bash_command="true", position=i) for i in range(1500)])
    run = create_manual_run(dag)  # analyzes the table it grew
    ti = TaskInstance.objects.filter(dag_run=run).first()
    with _session(autocommit=True) as session:
        session.execute(f"PREPARE ended(bigint) AS {_ENDED_READ.replace('%s', '$1')}")
        for _ in range(8):  # past its first custom plans: the plan kept is the generic one
            session.execute(f"EXECUTE ended({ti.pk})")
        plan = _plan(session, f"EXECUTE ended({ti.pk})")
    assert "Seq Scan" not in plan, plan
    assert "ti_run_unfinished" in plan, plan
    assert "orchestrator_taskinstance_pkey" in plan, plan


def test_a_report_that_may_make_many_tasks_ready_reads_them_unprepared(postgresql_only):
    """Each count of tasks would be a statement of its own: prepared, a fan-out's reports would
    push the moves out of the connection's few prepared statements."""
    from orchestrator.engine.run_reads import PREPARED_READ_TASKS

    dag = DagFactory(dag_id="fan")
    TaskFactory(dag=dag, task_id="root")
    for i in range(PREPARED_READ_TASKS + 1):
        TaskFactory(dag=dag, task_id=f"m{i}", upstream=["root"])
    run = create_manual_run(dag)
    root = TaskInstance.objects.get(dag_run=run, task_id="root")
    assert reporting.claim(root.pk, root.attempt_token, WORKER)
    assert reporting.mark_running(root.pk, root.attempt_token, pid=1)
    assert reporting.report_success(root.pk, root.attempt_token)
    assert not [statement for statement in _prepared() if "ti.task_id IN (" in statement], _prepared()
    assert TaskInstance.objects.filter(dag_run=run, state="queued").count() == PREPARED_READ_TASKS + 1


def test_only_constant_names_are_written_into_a_statement():
    from orchestrator.data.sql import literals

    assert literals(["none", "up_for_retry"]) == "'none', 'up_for_retry'"
    for hostile in ("x'); DROP TABLE orchestrator_taskinstance; --", "a b", "it's"):
        with pytest.raises(ValueError, match="not a constant name"):
            literals(["none", hostile])


def test_a_big_run_is_created_at_once_while_its_table_cannot_be_analyzed(postgresql_only, caplog):
    """Another session holds the lock an ANALYZE needs (autovacuum's, an operator's VACUUM): the
    run is created all the same, the trigger waits about a second for the lock, not for as long
    as that session holds it, and says why the table was not analyzed."""
    import time

    from orchestrator.engine import tablestats
    from orchestrator.models import Task

    dag = DagFactory(dag_id="big_while_locked")
    Task.objects.bulk_create([Task(dag=dag, task_id=f"t{i:04d}", bash_command="true", position=i) for i in range(1500)])
    vacuuming = _session()
    try:
        # Its lock goes with it after 8 s idle: a trigger that waited for it fails the test, not hangs it.
        vacuuming.execute("SET idle_in_transaction_session_timeout = '8s'")
        vacuuming.execute("LOCK TABLE orchestrator_taskinstance IN SHARE UPDATE EXCLUSIVE MODE")
        began = time.monotonic()
        run = create_manual_run(dag)
        took = time.monotonic() - began
    finally:
        vacuuming.close()
    assert TaskInstance.objects.filter(dag_run=run).count() == 1500
    assert took < tablestats.LOCK_WAIT_MS / 1000 + 5, took
    assert "could not analyze orchestrator_taskinstance" in caplog.text
