"""The periodic check (deadlines.check.check_due): misses exactly once, whatever the task is doing."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone
from rq import Queue

from deadlines import check
from deadlines.check import check_due
from deadlines.models import Deadline
from orchestrator import listeners
from orchestrator.data import metrics
from orchestrator.engine import reporting
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import DagRun, TaskInstance
from tests.deadlines import recording_listener
from tests.deadlines.factories import DeadlineDefinitionFactory, add_history, chain_dag

pytestmark = pytest.mark.django_db(transaction=True)


def job_ids(queue: str = "default", prefix: str = "deadline-") -> list[str]:
    return [j for j in Queue(queue, connection=get_redis()).job_ids if j.startswith(prefix)]


@pytest.fixture(autouse=True)
def clean_queues():
    for name in ("default", "other"):
        Queue(name, connection=get_redis()).empty()
    get_redis().delete(f"orchestrator:metrics:{metrics.DEADLINE_MISSES}")
    yield
    for name in ("default", "other"):
        Queue(name, connection=get_redis()).empty()


def overdue_run(dag, seconds_ago: float = 120, interval: float = 60) -> DagRun:
    """A run queued `seconds_ago` with a dagrun_queued_at deadline `interval` after it."""
    if not dag.deadline_definitions.exists():
        DeadlineDefinitionFactory(dag=dag, interval=interval)
    queued = timezone.now() - timedelta(seconds=seconds_ago)
    return create_run(dag, run_type="manual", logical_date=queued, now=queued)


@override_settings(ORCHESTRATOR_LISTENERS=["tests.deadlines.recording_listener"])
def test_it_marks_a_due_deadline_missed_exactly_once():
    """A never-scheduled run past need-by: missed once, one callback job, one metric, one listener call."""
    recording_listener.missed.clear()
    run = overdue_run(chain_dag("never_started"))
    deadline = run.deadlines.get()
    now = timezone.now()
    assert check_due(now) == 1
    assert check_due(now) == 0
    deadline.refresh_from_db()
    assert (deadline.state, deadline.callback_state, deadline.callback_attempts) == ("missed", "queued", 1)
    assert deadline.lateness_seconds == pytest.approx(60, abs=5)
    assert job_ids() == [f"deadline-{deadline.pk}-missed-1"]
    assert metrics.read(metrics.DEADLINE_MISSES) == [({"dag_id": "never_started"}, 1)]
    assert listeners.drain()
    assert recording_listener.missed == [deadline.pk]


def test_it_leaves_deadlines_that_are_not_due():
    """need_by in the future: nothing happens."""
    run = overdue_run(chain_dag("future"), seconds_ago=0, interval=3600)
    assert check_due(timezone.now()) == 0
    assert run.deadlines.get().state == "pending"
    assert job_ids() == []


def test_it_misses_a_task_deadline_while_the_task_is_still_queued_and_no_worker_runs():
    """task_queued_at: the task sits in the queue with no worker at all; the check still catches it."""
    dag = chain_dag("stuck", ("extract",))
    DeadlineDefinitionFactory(dag=dag, task=dag.tasks.get(), reference="task_queued_at", interval=0.2)
    run = create_run(dag, run_type="manual", logical_date=timezone.now())
    advance_run(run.pk)
    assert TaskInstance.objects.get(dag_run=run).state == "queued"
    deadline = run.deadlines.get()
    assert check_due(timezone.now()) == 0
    assert check_due(deadline.need_by + timedelta(seconds=1)) == 1
    deadline.refresh_from_db()
    assert (deadline.state, deadline.scope, deadline.task_id) == ("missed", "task", "extract")
    assert job_ids() == [f"deadline-{deadline.pk}-missed-1"]


@pytest.mark.parametrize("state", ["up_for_retry", "dead_letter", "running", "none"])
def test_it_misses_whatever_the_unfinished_task_is_doing(state):
    """Blocked, retrying, running or never scheduled: the check reads only need_by and 'unfinished'."""
    run = overdue_run(chain_dag(f"task_{state}"))
    TaskInstance.objects.filter(dag_run=run).update(state=state)
    assert check_due(timezone.now()) == 1
    assert run.deadlines.get().state == "missed"


def test_it_settles_a_due_deadline_of_a_finished_run_by_its_end_time():
    """A due row whose run already finished (in time) is marked met, not missed."""
    run = overdue_run(chain_dag("finished"))
    deadline = run.deadlines.get()
    DagRun.objects.filter(pk=run.pk).update(state="success", end_date=deadline.need_by - timedelta(seconds=5))
    assert check_due(timezone.now()) == 1
    deadline.refresh_from_db()
    assert (deadline.state, deadline.lateness_seconds) == ("met", -5)
    assert job_ids() == []


def test_it_queues_the_callback_on_the_queue_named_in_callback_kwargs():
    """callback_kwargs.queue picks the worker queue."""
    dag = chain_dag("queued_elsewhere")
    DeadlineDefinitionFactory(dag=dag, interval=1, callback_kwargs={"queue": "other"})
    overdue_run(dag)
    check_due(timezone.now())
    assert len(job_ids("other")) == 1
    assert job_ids("default") == []


def test_it_returns_a_full_batch_so_the_scheduler_calls_again():
    """With more due rows than the limit, each call handles `limit` of them, soonest first."""
    dag = chain_dag("backlog")
    for i in range(7):
        overdue_run(dag, seconds_ago=120 + i)
    now = timezone.now()
    assert [check_due(now, limit=3) for _ in range(4)] == [3, 3, 1, 0]
    assert Deadline.objects.filter(state="missed").count() == 7
    assert len(job_ids()) == 7


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_it_finds_due_rows_through_the_partial_index():
    """The claiming query is an index scan of deadline_due in need_by order: no sort of all due rows
    (the planner is told not to seq-scan this tiny table)."""
    overdue_run(chain_dag("explain"))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = check.claim_query(timezone.now(), 500).explain()
    assert "Index Scan using deadline_due" in plan
    assert "Sort" not in plan


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_it_misses_each_deadline_once_with_two_checkers_at_once():
    """Two threads, each with its own connection, drain 300 due deadlines together: one job each."""
    dag = chain_dag("two_checkers")
    DeadlineDefinitionFactory(dag=dag, interval=1)
    queued = timezone.now() - timedelta(minutes=5)
    runs = [DagRun(dag=dag, run_id=f"r{i}", logical_date=queued, queued_at=queued, state="running") for i in range(300)]
    DagRun.objects.bulk_create(runs)
    Deadline.objects.bulk_create(
        Deadline(dag_run=run, reference="dagrun_queued_at", callback="notifier:log", need_by=queued) for run in DagRun.objects.filter(dag=dag)
    )
    now = timezone.now()
    barrier = threading.Barrier(2)
    claimed: list[int] = []

    def checker() -> None:
        try:
            barrier.wait()
            while (n := check_due(now, limit=25)) > 0:
                claimed.append(n)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=checker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(claimed) == 300
    assert Deadline.objects.filter(state="missed", callback_attempts=1).count() == 300
    ids = job_ids()
    assert len(ids) == len(set(ids)) == 300


def test_it_marks_at_risk_once_before_the_miss_when_warn_is_on():
    """warn: true with enough history: at_risk (one at-risk callback) while the run can still make it, then missed."""
    dag = chain_dag("elmo", ("a", "b"))
    DeadlineDefinitionFactory(dag=dag, interval=30, warn=True)
    add_history(dag, {"a": 20, "b": 20})
    run = create_run(dag, run_type="manual", logical_date=timezone.now())
    deadline = run.deadlines.get()
    now = deadline.need_by - timedelta(seconds=35)  # 35 s left, ~40 s of work ahead
    assert check_due(now) == 0
    deadline.refresh_from_db()
    assert (deadline.state, deadline.warned_at, deadline.warn_callback_state) == ("at_risk", now, "queued")
    assert check_due(now + timedelta(seconds=1)) == 0
    assert job_ids() == [f"deadline-{deadline.pk}-at_risk-1"]
    at_risk_job = Queue("default", connection=get_redis()).fetch_job(f"deadline-{deadline.pk}-at_risk-1")
    assert at_risk_job.kwargs == {"estimate": 40.0}
    assert check_due(deadline.need_by + timedelta(seconds=1)) == 1
    deadline.refresh_from_db()
    assert (deadline.state, deadline.callback_state) == ("missed", "queued")
    assert sorted(job_ids()) == sorted([f"deadline-{deadline.pk}-at_risk-1", f"deadline-{deadline.pk}-missed-1"])


def test_it_does_not_warn_without_enough_history_or_when_there_is_time():
    """No estimate without three successful attempts per unfinished task; no warning with time to spare."""
    thin = chain_dag("thin", ("a",))
    DeadlineDefinitionFactory(dag=thin, interval=30, warn=True)
    add_history(thin, {"a": 20}, runs=2)
    run = create_run(thin, run_type="manual", logical_date=timezone.now())
    check_due(run.deadlines.get().need_by - timedelta(seconds=1))
    assert run.deadlines.get().state == "pending"
    roomy = chain_dag("roomy", ("a",))
    DeadlineDefinitionFactory(dag=roomy, interval=300, warn=True)
    add_history(roomy, {"a": 20})
    run = create_run(roomy, run_type="manual", logical_date=timezone.now())
    check_due(timezone.now())
    assert run.deadlines.get().state == "pending"


def test_it_counts_a_running_task_by_what_is_left_of_its_typical_duration():
    """A task 15 s into a typical 20 s has ~5 s left: a deadline 10 s away is not at risk, 3 s away is."""
    dag = chain_dag("partial", ("a",))
    DeadlineDefinitionFactory(dag=dag, task=dag.tasks.get(), reference="task_started_at", interval=60, warn=True)
    add_history(dag, {"a": 20})
    run = create_run(dag, run_type="manual", logical_date=timezone.now())
    advance_run(run.pk)
    ti = TaskInstance.objects.get(dag_run=run)
    assert reporting.mark_running(ti.pk, ti.attempt_token)
    ti.refresh_from_db()
    deadline = run.deadlines.get()
    Deadline.objects.filter(pk=deadline.pk).update(need_by=ti.start_date + timedelta(seconds=25))
    check_due(ti.start_date + timedelta(seconds=15))
    deadline.refresh_from_db()
    assert deadline.state == "pending"
    Deadline.objects.filter(pk=deadline.pk).update(need_by=ti.start_date + timedelta(seconds=18))
    check_due(ti.start_date + timedelta(seconds=15))
    deadline.refresh_from_db()
    assert deadline.state == "at_risk"


@override_settings(ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS=2, ORCHESTRATOR_DEADLINE_CALLBACK_QUEUE_LEASE=60)
def test_it_dispatches_a_lost_callback_again_then_gives_up():
    """A queued callback whose job vanished from Redis is dispatched again after its lease; past the
    attempts it is failed with the reason."""
    run = overdue_run(chain_dag("lost"))
    now = timezone.now()
    check_due(now)
    deadline = run.deadlines.get()
    Queue("default", connection=get_redis()).empty()
    get_redis().delete(f"rq:job:deadline-{deadline.pk}-missed-1")
    assert check_due(now + timedelta(seconds=30)) == 0  # lease not over yet
    assert job_ids() == []
    check_due(now + timedelta(seconds=61))
    deadline.refresh_from_db()
    assert (deadline.callback_state, deadline.callback_attempts) == ("queued", 2)
    assert "callback job lost" in deadline.callback_error
    assert job_ids() == [f"deadline-{deadline.pk}-missed-2"]
    Queue("default", connection=get_redis()).fetch_job(f"deadline-{deadline.pk}-missed-2").delete()
    check_due(now + timedelta(seconds=200))
    deadline.refresh_from_db()
    assert deadline.callback_state == "failed"
    assert deadline.callback_error.startswith("dispatch 2 of 2: callback job lost")


def test_it_extends_the_lease_while_the_job_waits_for_a_busy_worker():
    """A callback job still waiting in Redis is not dispatched twice."""
    run = overdue_run(chain_dag("busy"))
    now = timezone.now()
    check_due(now)
    check_due(now + timedelta(hours=1))
    deadline = run.deadlines.get()
    assert (deadline.callback_state, deadline.callback_attempts) == ("queued", 1)
    assert deadline.callback_next_at > now + timedelta(hours=1)
    assert job_ids() == [f"deadline-{deadline.pk}-missed-1"]
