"""`max_active_runs` is one rule for both paths that ask about it (`engine.run_rules`): the scheduler
creates a DAG's next scheduled run only when a slot is left for it after the queued runs, and a
queued run starts while a slot is free. So a run the scheduler creates starts at once, and where
it creates none a run in its place would only wait."""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from itertools import product

import pytest

from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_run
from orchestrator.engine.run_rules import ActiveRuns, may_create_scheduled_run, may_start_run
from orchestrator.engine.scheduler import create_due_run
from orchestrator.models import Backfill, Dag, DagRun
from retries.states import RunState
from tests.engine.factories import DagFactory, TaskFactory

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
MAX = 2


def _dag() -> Dag:
    dag = DagFactory(schedule="@hourly", catchup=True, next_run_logical_date=NOW - timedelta(hours=6), max_active_runs=MAX)
    TaskFactory(dag=dag, task_id="t")  # its run stays running: no worker takes it
    return dag


def _runs(dag: Dag, state: RunState, count: int, first: int) -> list[DagRun]:
    runs = [
        create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=NOW - timedelta(days=first + i), now=NOW, run_id=f"r{first + i}")
        for i in range(count)
    ]
    DagRun.objects.filter(pk__in=[run.pk for run in runs]).update(state=state)
    return runs


def _state(run: DagRun) -> str:
    run.refresh_from_db(fields=["state"])
    return run.state


@pytest.mark.django_db
@pytest.mark.parametrize(("running", "queued"), list(product(range(MAX + 2), range(MAX + 1))))
def test_a_scheduled_run_is_created_only_when_it_would_start(running, queued):
    dag = _dag()
    _runs(dag, RunState.RUNNING, running, first=10)
    waiting = _runs(dag, RunState.QUEUED, queued, first=20)

    created = create_due_run(dag, NOW)
    assert (created is not None) == (running + queued < MAX)
    for run in waiting:  # the runs queued first take the free slots first
        advance_run(run.pk, NOW)
    assert [_state(run) for run in waiting].count(RunState.RUNNING) == min(queued, max(0, MAX - running))
    if created is not None:
        advance_run(created.pk, NOW)
        assert _state(created) == RunState.RUNNING  # a slot was left for it
    else:
        in_its_place = _runs(dag, RunState.QUEUED, 1, first=30)[0]
        advance_run(in_its_place.pk, NOW)
        assert _state(in_its_place) == RunState.QUEUED  # no slot was left: it would only have waited


@pytest.mark.django_db
def test_a_backfills_runs_take_no_slot():
    """A backfill's runs count against the backfill's own limit: the DAG's slots stay free for
    its scheduled runs and for its queued runs to start."""
    dag = _dag()
    backfill = Backfill.objects.create(dag=dag, from_date=NOW - timedelta(days=3), to_date=NOW, created_at=NOW)
    backfill_runs = _runs(dag, RunState.RUNNING, MAX, first=10) + _runs(dag, RunState.QUEUED, MAX, first=20)
    DagRun.objects.filter(pk__in=[run.pk for run in backfill_runs]).update(backfill=backfill)
    waiting = _runs(dag, RunState.QUEUED, 1, first=30)[0]
    created = create_due_run(dag, NOW)
    assert created is not None
    advance_run(waiting.pk, NOW)
    assert _state(waiting) == RunState.RUNNING


@pytest.mark.parametrize(("running", "queued"), list(product(range(MAX + 2), range(MAX + 1))))
def test_the_two_rules_agree(running, queued):
    """Whenever the scheduler may create a run, a run may start; a run may start while fewer are running."""
    active = ActiveRuns(running=running, queued=queued)
    assert may_start_run(MAX, active) == (running < MAX)
    assert may_create_scheduled_run(MAX, active) == (running + queued < MAX)
    assert not may_create_scheduled_run(MAX, active) or may_start_run(MAX, active)


@pytest.mark.django_db(transaction=True)
def test_a_start_that_waited_for_the_dags_lock_counts_the_run_its_holder_started():
    """Two processes starting runs of one DAG at once: the second waits for the DAG's lock while
    the first starts a run, and must then count that run (a count read in the locking statement
    would use the snapshot taken before the wait, and see a slot free that is not)."""
    from orchestrator.engine.run_reads import active_runs

    dag = _dag()
    (first,) = _runs(dag, RunState.QUEUED, 1, first=0)
    counted: list[ActiveRuns] = []

    def holder() -> None:
        assert active_runs(dag.pk, locked=True).running == 0
        DagRun.objects.filter(pk=first.pk).update(state=RunState.RUNNING)

    _second_waits_for_the_first(holder, lambda: counted.append(active_runs(dag.pk, locked=True)))
    assert len(counted) == 1
    assert counted[0].running == 1


@pytest.mark.django_db(transaction=True)
def test_a_start_that_waited_for_the_dags_lock_leaves_the_last_slot_to_the_run_its_holder_started():
    """The start itself (the count and the move in one statement, after the lock): with one slot
    and two queued runs started at once, the second waits for the first's lock and stays queued."""
    from orchestrator.engine.run_advance import _start_run

    dag = _dag()
    Dag.objects.filter(pk=dag.pk).update(max_active_runs=1)
    first, second = _runs(dag, RunState.QUEUED, 2, first=0)
    started: dict[str, bool] = {}

    def start(name: str, run: DagRun) -> None:
        run = DagRun.objects.select_related("dag").get(pk=run.pk)
        started[name] = _start_run(run, NOW)

    _second_waits_for_the_first(lambda: start("first", first), lambda: start("second", second))
    assert started == {"first": True, "second": False}
    assert (_state(first), _state(second)) == (RunState.RUNNING, RunState.QUEUED)


def _second_waits_for_the_first(first: Callable[[], None], second: Callable[[], None]) -> None:
    """`first` and `second` each in a transaction of its own thread (PostgreSQL only): the first
    holds its transaction open until the second is seen waiting for a lock, then commits."""
    import threading

    from django.db import connection, transaction

    from tests.conftest import wait_until

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's transactions take the database's write lock: no row lock to wait for")
    holding, release = threading.Event(), threading.Event()

    def run(body: Callable[[], None], hold: bool) -> None:
        try:
            with transaction.atomic():
                body()
                if hold:
                    holding.set()
                    release.wait(20)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(first, True))]
    threads[0].start()
    assert holding.wait(20)
    threads.append(threading.Thread(target=run, args=(second, False)))
    threads[1].start()

    def second_blocked() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            return cursor.fetchone()[0] >= 1

    wait_until(second_blocked, timeout=20, message="the second transaction waiting for the first's lock")
    release.set()
    for thread in threads:
        thread.join(20)
