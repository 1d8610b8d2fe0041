"""A result travels with the outcome: written to the worker's spool while the database is away,
delivered later by the spool's own path, and refused with the whole report when its attempt was
superseded meanwhile (a newer attempt's result is never overwritten)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.foundation.clock import shared_now
from orchestrator.models import TaskInstance
from orchestrator.worker.classify import Outcome, Verdict
from orchestrator.worker.host.job import deliver_spooled
from orchestrator.worker.host.report import report_of
from orchestrator.worker.host.spool import Spool, Streaks
from orchestrator.worker.host.supervisor import Supervised
from retries.context import ExecutionContext
from retries.states import Reason, Source
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _runtime() -> SimpleNamespace:
    """What deliver_spooled uses of a worker: its database calls, its leases, its spool's count
    of repeated errors."""
    return SimpleNamespace(db=SimpleNamespace(call=lambda f, *a, **k: f(*a, **k)),
                           heartbeats=SimpleNamespace(forget_attempt=lambda *a: None),
                           spool=SimpleNamespace(streaks=Streaks()))


def _spool_success(tmp_path, ti: TaskInstance, token: int, result) -> Spool:
    spool = Spool(tmp_path / "spool")
    supervised = Supervised(superseded=False, outcome=Outcome(), stdout="out", stderr="", output_truncated=False)
    spool.put(report_of(ti.pk, token, Verdict(True, result=result), supervised, shared_now()).to_json())
    return spool


def test_a_spooled_success_delivers_its_result(tmp_path):
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="extract", python_callable="x.y", bash_command="")
    ti = TaskInstance.objects.get(dag_run=create_manual_run(dag))
    assert reporting.claim(ti.pk, 1, WORKER)
    assert reporting.mark_running(ti.pk, 1, pid=1)
    spool = _spool_success(tmp_path, ti, 1, {"files": ["a", "b"]})
    # The database was away: the report waited on disk; now the spool's thread delivers it.
    assert spool.drain(lambda record: deliver_spooled(_runtime(), record)) == 1
    ti.refresh_from_db()
    assert ti.state == "success"
    assert ti.result == {"files": ["a", "b"]}


def test_a_superseded_attempts_late_report_never_overwrites_the_newer_result(tmp_path, settings):
    settings.ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY = 0
    dag = DagFactory(default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="extract")
    ti = TaskInstance.objects.get(dag_run=create_manual_run(dag))
    assert reporting.claim(ti.pk, 1, WORKER)
    assert reporting.mark_running(ti.pk, 1, pid=1)
    old = _spool_success(tmp_path, ti, 1, "old result")  # its worker lost the database, then its lease
    lost = ExecutionContext.of(Reason.WORKER_LOST, Source.SCHEDULER)
    assert reporting.report_failure(ti.pk, 1, lost)  # presumed lost: a platform retry
    from orchestrator.engine.run_advance import advance_run

    advance_run(ti.dag_run_id)
    ti.refresh_from_db()
    assert ti.attempt_token == 2
    assert reporting.claim(ti.pk, 2, WORKER)
    assert reporting.mark_running(ti.pk, 2, pid=2)
    assert reporting.report_success(ti.pk, 2, result="new result")
    assert old.drain(lambda record: deliver_spooled(_runtime(), record)) == 1  # delivered: refused as stale
    ti.refresh_from_db()
    assert (ti.state, ti.result) == ("success", "new result")
