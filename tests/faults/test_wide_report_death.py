"""A worker dies while it dispatches the later chunks of a fan-out its report made ready: the
report and its first chunk are committed, the chunk in flight is rolled back with the process,
and the tasks it held are still `none` with their upstream done. The scheduler settles and
dispatches them; none is lost, none runs twice."""
from __future__ import annotations

import os
import signal

import pytest
from django.db import connection, transaction

from orchestrator.engine.run_advance import FIRST_DISPATCH_CHUNK
from orchestrator.models import TaskInstance
from tests.conftest import wait_until
from tests.faults.conftest import T, settle_runs
from tests.faults.invariants import assert_invariants, attempts_of
from tests.worker.conftest import instance, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

LATER = 50  # tasks past the report's first chunk


def _recorded(task_id: str, records, upstream: list[str]) -> dict:
    return {"task_id": task_id, "python_callable": T + "recorded", "op_kwargs": {"records": str(records)}, "upstream": upstream}


def _a_dispatch_waits_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction: look again
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] >= 1


def test_kill_9_between_the_chunks_of_a_reports_fan_out(worker, make_dag, records, scheduler_settings):
    if connection.vendor != "postgresql":
        pytest.skip("holds a row lock while another process writes: PostgreSQL's")
    middle = [f"m{i:03d}" for i in range(FIRST_DISPATCH_CHUNK + LATER)]
    dag = make_dag([_recorded("root", records, []), *[_recorded(name, records, ["root"]) for name in middle]])
    run = trigger(dag)
    later = middle[FIRST_DISPATCH_CHUNK:]
    with transaction.atomic():
        # The last task's row locked: the report commits (it writes nothing of the later chunk),
        # then the later chunk's dispatch waits here.
        TaskInstance.objects.select_for_update().get(dag_run=run, task_id=later[-1])
        doomed = worker()
        wait_until(_a_dispatch_waits_on_a_lock, timeout=30, message="the later chunk's dispatch to wait on the locked row")
        assert instance(run, "root").state == "success"
        assert run.task_instances.filter(task_id__in=middle[:FIRST_DISPATCH_CHUNK]).exclude(state="none").count() == FIRST_DISPATCH_CHUNK
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=10)
    # Nothing of the chunk in flight was kept, and nothing of the later tasks was written ahead.
    wait_until(lambda: not _a_dispatch_waits_on_a_lock(), timeout=10, message="the dead worker's transaction to end")
    assert set(run.task_instances.filter(task_id__in=later).values_list("state", "attempt_token")) == {("none", 0)}
    # A job the dead worker had taken but not claimed is found lost once queued this long.
    scheduler_settings.ORCHESTRATOR_QUEUED_TIMEOUT = 2
    worker()
    settle_runs([run], timeout=60)
    assert run.state == "success"
    for task_id in later:
        assert attempts_of(instance(run, task_id)) == [("user", "success", None, 1, 0)], task_id
    assert_invariants([run], [records])
