"""On PostgreSQL an attempt's moves (claim, handshake, report) are prepared statements, planned
once per connection; reads of a run's tasks are not (a plan kept from when the table was small
would keep its sequential scan as the table grows). Fencing is the same either way."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from orchestrator.engine import reporting
from orchestrator.engine.runs import create_manual_run
from orchestrator.models import TaskInstance
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

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


def test_an_attempts_moves_are_prepared_and_a_runs_reads_are_not(postgresql_only):
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
    # Reads of the run's tasks by anything but a unique key stay unprepared.
    assert not [statement for statement in prepared if "dag_run_id = $" in statement and "WITH moved" not in statement], prepared
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
    assert ti.state == "running" and ti.result is None


@override_settings(ORCHESTRATOR_DB_PREPARED_STATEMENTS=False)
def test_nothing_is_prepared_when_turned_off(postgresql_only):
    _, ti = _chain()
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    assert _prepared() == []
