"""A success's report claims the next task for the reporting slot in its own transaction. When
the server commits that transaction but the answer is lost (the connection breaks at COMMIT),
the worker tries the report again, finds it already recorded, and must recognise the claim that
committed with it: the next task runs at once in the slot, not a heartbeat timeout later as the
platform's failure. Real database; the lost answer to COMMIT is the one thing injected."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from django.db import OperationalError, connections, transaction

from orchestrator.engine import handover, reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import TaskInstance
from orchestrator.worker.classify import Outcome, Verdict
from orchestrator.worker.host import job
from orchestrator.worker.host.runtime import DatabasePool
from orchestrator.worker.host.spool import Spool
from orchestrator.worker.host.supervisor import Supervised
from retries.states import TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]


@pytest.fixture
def commit_answer_lost(monkeypatch):
    """The first COMMIT of a report that offers its slot reaches the server and commits; its
    answer never comes back (an OperationalError, as for a connection broken after the commit)."""
    wrapper = type(connections["default"])
    commit = wrapper._commit
    lost: list[bool] = []

    def commit_then_lose_the_answer(self):
        commit(self)
        if handover.wanted() is not None and not lost:
            lost.append(True)
            raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(wrapper, "_commit", commit_then_lose_the_answer)
    return lost


def _runtime(tmp_path, pool: DatabasePool, handed: list) -> SimpleNamespace:
    """What a slot's report uses of its worker: the real database pool and spool; the hand-on
    and the leases recorded."""
    return SimpleNamespace(
        name="test-worker", db=pool, spool=Spool(tmp_path / "spool"), offered_queues=lambda: frozenset({"default"}),
        hand_on=handed.append, heartbeats=SimpleNamespace(forget_attempt=lambda *a: None),
    )  # fmt: skip


def test_a_task_claimed_by_a_report_whose_commit_was_not_heard_of_runs_at_once(tmp_path, commit_answer_lost, settings):
    settings.ORCHESTRATOR_REPORT_PATIENCE = 30
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="root")
    TaskFactory(dag=dag, task_id="next", upstream=["root"])
    run = create_manual_run(dag)
    root = TaskInstance.objects.get(dag_run=run, task_id="root")
    holder = job.worker_info()
    assert reporting.claim(root.pk, root.attempt_token, holder)
    assert reporting.mark_running(root.pk, root.attempt_token, pid=1)
    handed: list[reporting.Claimed] = []
    pool = DatabasePool(1)
    try:
        supervised = Supervised(superseded=False, outcome=Outcome(), stdout="", stderr="")
        started = time.monotonic()
        described = job._report(_runtime(tmp_path, pool, handed), root.pk, root.attempt_token, Verdict(True, result={"rows": 3}), supervised)
        took = time.monotonic() - started
    finally:
        pool.close()
    assert commit_answer_lost == [True]  # the first try committed; its answer was lost
    assert described == "stale"  # tried again: already recorded
    nxt = TaskInstance.objects.get(dag_run=run, task_id="next")
    assert [(claimed.pk, claimed.attempt_token, claimed.task_id) for claimed in handed] == [(nxt.pk, nxt.attempt_token, "next")]
    assert handed[0].results == {"root": {"rows": 3}}
    assert took < 10, took  # a retry's backoff, not a heartbeat timeout
    # The slot runs it: its handshake goes on from the claim that committed with the report.
    assert reporting.mark_running(nxt.pk, nxt.attempt_token, pid=2)
    assert TaskInstance.objects.get(pk=nxt.pk).state == TaskState.RUNNING


def test_a_claim_that_did_not_commit_is_not_run(tmp_path, settings):
    """A report whose first try did not commit at all (the connection broke before COMMIT): the
    retry records it and the dispatch sends the next task to Redis; the claim the first try
    made was rolled back with it and is not run by the slot."""
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="root")
    TaskFactory(dag=dag, task_id="next", upstream=["root"])
    run = create_manual_run(dag)
    root = TaskInstance.objects.get(dag_run=run, task_id="root")
    assert reporting.claim(root.pk, root.attempt_token, job.worker_info())
    assert reporting.mark_running(root.pk, root.attempt_token, pid=1)
    offer = job._slot_offer(_runtime(tmp_path, None, []))  # type: ignore[arg-type]

    def report_then_break() -> None:
        with handover.offering(offer), transaction.atomic():
            assert reporting.report_success(root.pk, root.attempt_token, result=None)
            raise RuntimeError("the connection broke before COMMIT")

    with pytest.raises(RuntimeError, match="before COMMIT"):
        report_then_break()
    assert offer.unconfirmed is not None
    assert offer.taken is None
    assert reporting.report_success(root.pk, root.attempt_token, result=None)  # the retry: no offer is made twice
    nxt = TaskInstance.objects.get(dag_run=run, task_id="next")
    assert nxt.worker_name == ""  # queued for any worker, not claimed
    assert offer.unheard(lambda pk, token: reporting.holds_claim(pk, token, job.worker_info())) is None
