"""A running worker keeps working across a migration that changes the type of a column its
prepared statements return: its next claims and reports succeed at their first try, on the
connections it already had."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from orchestrator.models import TaskInstance
from tests.engine.test_prepared_after_migration import TABLE, other_connection
from tests.worker.conftest import settle, trigger

T = "tests.worker.tasks."

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def queue_column_restored() -> Iterator[None]:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    yield
    connection.close()
    with other_connection() as conn:
        conn.execute(f"ALTER TABLE {TABLE} ALTER COLUMN queue TYPE varchar(100)")


def test_a_running_worker_claims_and_reports_after_an_alter_table(worker, make_dag, queue_column_restored):
    dag = make_dag([{"task_id": f"t{n}", "python_callable": T + "succeed"} for n in range(4)])
    proc = worker()
    before = trigger(dag)
    for n in range(4):
        settle(before, f"t{n}", ("success",))
    with other_connection() as conn:  # the migration, while the worker waits for its next job
        conn.execute(f"ALTER TABLE {TABLE} ALTER COLUMN queue TYPE varchar(150)")
    after = trigger(dag)
    for n in range(4):
        settle(after, f"t{n}", ("success",))
    assert proc.poll() is None
    tis = TaskInstance.objects.filter(dag_run=after)
    assert [(ti.try_number, ti.infrastructure_try_number, ti.attempts.count()) for ti in tis] == [(1, 0, 1)] * 4
