"""A success report hands the next task to the reporting worker's slot: claimed in the report's
own transaction, no job on Redis for it, and nothing given when the transaction does not commit."""
from __future__ import annotations

import functools

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rq import Queue

from orchestrator.engine import handover, reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import TaskInstance
from retries.states import TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue", "caches_held")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=4242)


def _ti(run, task_id: str) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def _offer(queues: frozenset[str] = frozenset({"default"})) -> handover.Offer:
    return handover.Offer(lambda: queues, functools.partial(reporting.claim_within, worker=WORKER))


def _job_ids() -> list[str]:
    return Queue("default", connection=get_redis()).get_job_ids()


def _run_with_root_running(dag):
    run = create_manual_run(dag)
    root = _ti(run, "root")
    assert reporting.claim(root.pk, root.attempt_token, WORKER)
    assert reporting.mark_running(root.pk, root.attempt_token, pid=1)
    Queue("default", connection=get_redis()).empty()  # the root's own job
    return run, root


def _chain(dag_id: str):
    dag = DagFactory(dag_id=dag_id)
    TaskFactory(dag=dag, task_id="root")
    TaskFactory(dag=dag, task_id="next", upstream=["root"])
    return dag


def test_the_next_task_is_claimed_with_the_report_and_never_enqueued():
    run, root = _run_with_root_running(_chain("handed"))
    offer = _offer()
    with handover.offering(offer):
        assert reporting.report_success(root.pk, root.attempt_token, result={"rows": 3})
    nxt = _ti(run, "next")
    assert nxt.state == TaskState.QUEUED
    assert (nxt.worker_name, nxt.hostname, nxt.heartbeat_at is not None) == ("test-worker", "test-host", True)
    attempt = nxt.attempts.get(attempt_token=nxt.attempt_token)
    assert (attempt.worker_name, attempt.pid) == ("test-worker", 4242)
    assert _job_ids() == []  # no job: the slot runs it
    claimed = offer.taken
    assert isinstance(claimed, reporting.Claimed)
    assert (claimed.pk, claimed.attempt_token, claimed.task_id) == (nxt.pk, nxt.attempt_token, "next")
    assert claimed.results == {"root": {"rows": 3}}  # the result its report wrote, in the same transaction
    # The claim is the worker's: a job for the same attempt (there is none) would be refused
    # as already claimed, and the handshake goes on from it.
    assert reporting.mark_running(nxt.pk, nxt.attempt_token, pid=2)


def test_a_handed_task_gets_every_upstreams_result():
    """The result its report wrote is given as it is; the others are read."""
    dag = DagFactory(dag_id="two_upstreams")
    TaskFactory(dag=dag, task_id="root")
    TaskFactory(dag=dag, task_id="side")
    TaskFactory(dag=dag, task_id="next", upstream=["side", "root"])
    run = create_manual_run(dag)
    for task_id, result in (("side", ["s", 1]), ("root", {"r": None})):
        ti = _ti(run, task_id)
        assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
        assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
        offer = _offer()
        with handover.offering(offer):
            assert reporting.report_success(ti.pk, ti.attempt_token, result=result)
    assert offer.taken.task_id == "next"
    assert offer.taken.results == {"side": ["s", 1], "root": {"r": None}}


def test_without_a_free_queue_the_next_task_goes_to_redis_unclaimed():
    """The worker's queue has jobs waiting (or it is stopping): no queue is offered, and the task
    waits its turn behind them like any job."""
    run, root = _run_with_root_running(_chain("not_handed"))
    offer = _offer(frozenset())
    with handover.offering(offer):
        assert reporting.report_success(root.pk, root.attempt_token)
    nxt = _ti(run, "next")
    assert nxt.state == TaskState.QUEUED
    assert nxt.heartbeat_at is None
    assert nxt.worker_name == ""
    assert _job_ids() == [nxt.job_id]
    assert offer.taken is None


def test_a_task_for_another_queue_is_not_taken():
    dag = DagFactory(dag_id="other_queue")
    TaskFactory(dag=dag, task_id="root")
    TaskFactory(dag=dag, task_id="next", upstream=["root"], args={"queue": "elsewhere"})
    run, root = _run_with_root_running(dag)
    offer = _offer()
    with handover.offering(offer):
        assert reporting.report_success(root.pk, root.attempt_token)
    nxt = _ti(run, "next")
    assert nxt.queue == "elsewhere"
    assert nxt.heartbeat_at is None
    assert Queue("elsewhere", connection=get_redis()).get_job_ids() == [nxt.job_id]
    Queue("elsewhere", connection=get_redis()).empty()
    assert offer.taken is None


def test_a_fan_out_hands_one_task_and_enqueues_the_rest():
    dag = DagFactory(dag_id="fan_handed")
    TaskFactory(dag=dag, task_id="root")
    for i in range(3):
        TaskFactory(dag=dag, task_id=f"m{i}", upstream=["root"])
    run, root = _run_with_root_running(dag)
    offer = _offer()
    with handover.offering(offer):
        assert reporting.report_success(root.pk, root.attempt_token)
    middle = [_ti(run, f"m{i}") for i in range(3)]
    assert all(ti.state == TaskState.QUEUED for ti in middle)
    taken = [ti for ti in middle if ti.heartbeat_at is not None]
    assert len(taken) == 1
    assert offer.taken.pk == taken[0].pk
    assert sorted(_job_ids()) == sorted(ti.job_id for ti in middle if ti is not taken[0])


def test_a_transaction_rolled_back_gives_nothing():
    """The claim is part of the dispatch's transaction: if that does not commit, neither the
    dispatch nor the claim happened, and the offer holds nothing to run."""
    run, root = _run_with_root_running(_chain("rolled_back"))
    root = _ti(run, "root")
    offer = _offer()
    nxt = _ti(run, "next")

    def report_then_roll_back() -> None:
        with handover.offering(offer), transaction.atomic():
            assert reporting.report_success(root.pk, root.attempt_token)
            assert _ti(run, "next").worker_name == "test-worker"  # claimed, inside the transaction
            raise RuntimeError("the report's transaction fails")

    with pytest.raises(RuntimeError, match="the report's transaction fails"):
        report_then_roll_back()
    assert offer.taken is None
    after = _ti(run, "next")
    assert (after.state, after.attempt_token, after.heartbeat_at) == (nxt.state, nxt.attempt_token, None)
    assert _job_ids() == []


def test_no_offer_outside_a_report():
    """The scheduler and operators dispatch with no offer in their thread: every task is a job."""
    assert handover.wanted() is None
    run = create_manual_run(_chain("scheduler_dispatch"))
    assert _job_ids() == [_ti(run, "root").job_id]


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the statement counts are PostgreSQL's")
def test_a_handed_step_costs_the_report_and_the_claims_move():
    """The report's five statements (see test_report_cost) and the claim's move with what it
    runs, in one transaction without a savepoint: no claim transaction after it, and no read of
    the result the report itself wrote."""
    dag = DagFactory(dag_id="handed_cost")
    for i in range(3):
        TaskFactory(dag=dag, task_id=f"t{i}", upstream=[f"t{i - 1}"] if i else [])
    run = create_manual_run(dag)
    for task_id in ("t0", "t1"):
        ti = _ti(run, task_id)
        if task_id == "t0":
            assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
        assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
        offer = _offer()
        with CaptureQueriesContext(connection) as queries, handover.offering(offer):
            assert reporting.report_success(ti.pk, ti.attempt_token)
        assert offer.taken is not None
    statements = [q["sql"] for q in queries.captured_queries]
    assert statements.count("BEGIN") <= 1, statements
    assert statements.count("COMMIT") == 1, statements
    assert not any("SAVEPOINT" in s for s in statements), statements
    work = [s for s in statements if s not in ("BEGIN", "COMMIT")]
    assert len(work) == 6, "\n".join(s[:90] for s in work)
    assert offer.taken.task_id == "t2"
    assert offer.taken.results == {"t1": None}
