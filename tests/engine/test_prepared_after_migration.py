"""A migration that changes the type of a column a prepared statement returns makes PostgreSQL
refuse that statement on every connection that prepared it (`cached plan must not change result
type`). A long-lived connection (a worker's, the scheduler's) recovers: its prepared statements
are dropped and the statement, or the transaction it failed in, runs once more."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import NotSupportedError, connection, transaction

from orchestrator.data import sql
from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import TaskInstance
from orchestrator.worker.host.runtime import DatabasePool
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)
TABLE = TaskInstance._meta.db_table
READ = f"SELECT queue FROM {TABLE} WHERE id = %s"


def other_connection() -> psycopg.Connection:
    """A connection of its own to the test database, as a migration's would be."""
    params = connection.get_connection_params()
    return psycopg.connect(**{key: value for key, value in params.items() if key not in ("cursor_factory", "context")}, autocommit=True)


@pytest.fixture
def migrate() -> Iterator[Callable[[], None]]:
    """`migrate()`: ALTER the type of the task's `queue` column (which the claim returns) from
    another connection, to a wider varchar each time. The column's type is put back after."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    connection.close()  # a connection of its own: its prepared statements are this test's
    widths = iter(range(101, 200))

    def alter() -> None:
        with other_connection() as conn:
            conn.execute(f"ALTER TABLE {TABLE} ALTER COLUMN queue TYPE varchar({next(widths)})")

    yield alter
    connection.close()
    with other_connection() as conn:
        conn.execute(f"ALTER TABLE {TABLE} ALTER COLUMN queue TYPE varchar(100)")


def _task() -> TaskInstance:
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="a")
    return TaskInstance.objects.get(dag_run=create_manual_run(dag), task_id="a")


def _read(pk: int) -> str:
    ((queue,),) = sql.fetch(READ, [pk], [None], prepare=True)
    return queue


def test_a_statement_outside_a_transaction_runs_again_on_its_own(migrate):
    ti = _task()
    assert _read(ti.pk) == "default"
    migrate()
    assert _read(ti.pk) == "default"  # the same connection, the same statement, prepared anew
    migrate()
    assert _read(ti.pk) == "default"  # and again after the next migration
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE from_sql = false")
        assert cursor.fetchone() == (1,)  # the stale ones are gone on the server too


def test_a_transaction_that_met_a_stale_plan_fails_once_and_runs_again(migrate):
    ti = _task()
    assert _read(ti.pk) == "default"
    migrate()

    def in_a_transaction() -> str:
        with transaction.atomic():
            return _read(ti.pk)

    with pytest.raises(NotSupportedError) as caught:
        in_a_transaction()  # a failed statement in a transaction can only be rolled back ...
    assert sql.is_stale_plan(caught.value)
    assert in_a_transaction() == "default"  # ... which dropped the connection's prepared statements
    migrate()
    assert sql.once_more_if_stale(in_a_transaction) == "default"  # the worker's and scheduler's way


def test_a_claim_and_a_report_on_a_workers_connection_succeed_after_a_migration(migrate):
    """Through the worker's own pool of connections: the claim is a prepared statement in a
    transaction, returning the altered column."""
    pool = DatabasePool(1)
    try:
        first, second = _task(), _task()
        assert pool.call(reporting.claim, first.pk, first.attempt_token, WORKER) is not None
        assert pool.call(reporting.mark_running, first.pk, first.attempt_token, pid=1)
        assert pool.call(reporting.report_success, first.pk, first.attempt_token)
        migrate()
        claimed = pool.call(reporting.claim, second.pk, second.attempt_token, WORKER)
        assert claimed is not None
        assert claimed.queue == "default"
        assert pool.call(reporting.mark_running, second.pk, second.attempt_token, pid=1)
        assert pool.call(reporting.report_success, second.pk, second.attempt_token, result={"ok": 1})
    finally:
        pool.close()
    second.refresh_from_db()
    assert (second.state, second.result, second.try_number) == ("success", {"ok": 1}, 1)


def test_another_refusal_is_not_taken_for_a_stale_plan(migrate):
    with pytest.raises(Exception, match="division by zero") as caught:
        sql.fetch("SELECT 1/0", [], [None], prepare=True)
    assert not sql.is_stale_plan(caught.value)


def test_a_trigger_after_a_migration_starts_its_run_at_its_first_try(migrate):
    """A trigger's transaction reads back the task instances it inserts in a prepared statement:
    a migration that changed one of their columns' types makes it run once more, whole."""
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="a")
    create_manual_run(dag)  # prepares the trigger's statements on this connection
    migrate()
    run = create_manual_run(dag)
    assert run.state == "running"
    assert TaskInstance.objects.get(dag_run=run).state == "queued"
