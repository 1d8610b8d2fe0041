"""A wide run's due tasks are dispatched in committed chunks: the first chunk's jobs reach Redis
before the next chunk is written, what a failure between chunks leaves (`none` and ready: a
task the dispatch alone decides on is written once, when it goes) is dispatched by the next
scheduler pass, never lost and never twice,
and the pass leaves a run to the dispatcher of its chunks while they go."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from rq import Queue

from orchestrator.engine import run_advance
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import DagRun, Pool, TaskAttempt, TaskInstance, job_id_for
from retries.states import TaskState, WaitKind
from tests.conftest import wait_until
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

CHUNK = 10


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(run_advance, "FIRST_DISPATCH_CHUNK", CHUNK)
    monkeypatch.setattr(run_advance, "DISPATCH_CHUNK", CHUNK)


def _wide_dag(n: int, **args):
    dag = DagFactory(dag_id=f"wide{n}")
    for i in range(n):
        TaskFactory(dag=dag, task_id=f"t{i:03d}", upstream=[], args=args)
    return dag


def _jobs() -> list[str]:
    return Queue("default", connection=get_redis()).job_ids


def _assert_dispatched_once(run, *, but: str | None = None) -> None:
    """Every task of the run (but the one named, whose job is long gone) queued with token 1, one
    attempt row and one job each."""
    tis = list(TaskInstance.objects.filter(dag_run=run).exclude(task_id=but))
    assert {(ti.state, ti.attempt_token, ti.try_number) for ti in tis} == {(TaskState.QUEUED, 1, 1)}
    assert TaskAttempt.objects.filter(task_instance__in=tis).count() == len(tis)
    assert sorted(_jobs()) == sorted(job_id_for(ti.pk, 1) for ti in tis)


def _at_chunk(monkeypatch, number: int, then: Callable[[DagRun], None], *, written: bool) -> tuple[list[int], Callable]:
    """At the dispatch of chunk `number`, `then(run)`: before the chunk is written, or (`written`)
    after it is, before its commit. Returns the size of each chunk as it goes, and the real
    dispatch, to put back."""
    real = run_advance.dispatch_ready
    sizes: list[int] = []

    def wrapped(run, due, now, **options):
        sizes.append(len(due))
        if len(sizes) == number and not written:
            then(run)
        went = real(run, due, now, **options)
        if len(sizes) == number and written:
            then(run)
        return went

    monkeypatch.setattr(run_advance, "dispatch_ready", wrapped)
    return sizes, real


def _crash(run: DagRun) -> None:
    raise RuntimeError("injected: the process died before this chunk committed")


def _second_chunk_fails(monkeypatch) -> Callable:
    """The second chunk's transaction fails after writing its dispatches, as a crash before its
    commit would; returns the real dispatch, to put back."""
    return _at_chunk(monkeypatch, 2, _crash, written=True)[1]


def test_the_first_chunk_is_on_redis_before_the_last_chunk_is_written(monkeypatch):
    dag = _wide_dag(35)
    seen: list[tuple[int, int, int]] = []  # (tasks in the chunk, jobs on Redis, tasks queued) as each chunk begins
    real = run_advance.dispatch_ready

    def watched(run, due, now, **options):
        seen.append((len(due), len(_jobs()), TaskInstance.objects.filter(dag_run=run, state=TaskState.QUEUED).count()))
        return real(run, due, now, **options)

    monkeypatch.setattr(run_advance, "dispatch_ready", watched)
    run = create_manual_run(dag)
    # Jobs reach Redis only after their transaction commits: each chunk began with the earlier
    # chunks committed and on Redis.
    assert seen == [(10, 0, 0), (10, 10, 10), (10, 20, 20), (5, 30, 30)]
    _assert_dispatched_once(run)


def test_the_scheduler_pass_counts_every_chunk():
    dag = _wide_dag(25)
    from django.utils import timezone

    from orchestrator.engine.run_creation import create_run

    run = create_run(dag, run_type="manual", logical_date=timezone.now())
    assert run_advance.advance_run(run.pk) == (25, False)
    _assert_dispatched_once(run)


def test_a_failure_between_chunks_leaves_the_rest_ready_for_the_next_pass(monkeypatch):
    """The second chunk's transaction fails after writing its dispatches (as a crash before its
    commit would): they roll back, the trigger still returns, the first chunk's jobs are on
    Redis, and the next scheduler pass dispatches the rest, each task once."""
    dag = _wide_dag(25)
    real = _second_chunk_fails(monkeypatch)
    run = create_manual_run(dag)
    states = sorted(TaskInstance.objects.filter(dag_run=run).values_list("state", flat=True))
    assert states.count(TaskState.QUEUED) == 10
    assert states.count(TaskState.NONE) == 15
    assert len(_jobs()) == 10
    assert TaskAttempt.objects.filter(task_instance__dag_run=run).count() == 10
    assert set(TaskInstance.objects.filter(dag_run=run, state=TaskState.NONE).values_list("attempt_token", flat=True)) == {0}

    monkeypatch.setattr(run_advance, "dispatch_ready", real)
    schedule_once()
    _assert_dispatched_once(run)


def test_a_pool_admits_exactly_its_slots_across_chunks():
    Pool.objects.create(name="narrow", slots=3)
    dag = _wide_dag(25, pool="narrow")
    run = create_manual_run(dag)
    tis = list(TaskInstance.objects.filter(dag_run=run))
    assert sum(ti.state == TaskState.QUEUED for ti in tis) == 3
    held = [ti for ti in tis if ti.state == TaskState.SCHEDULED]
    assert len(held) == 22
    assert all(ti.waiting_for["kind"] == WaitKind.POOL and ti.waiting_for["name"] == "narrow" for ti in held)
    assert len(_jobs()) == 3


def test_the_rest_waits_when_the_dag_is_paused_between_chunks(monkeypatch):
    dag = _wide_dag(25)
    # Paused in the first chunk's transaction: committed with it.
    sizes, real = _at_chunk(monkeypatch, 1, lambda run: type(dag).objects.filter(pk=dag.pk).update(paused=True), written=True)
    run = create_manual_run(dag)
    assert sizes == [10]
    assert TaskInstance.objects.filter(dag_run=run, state=TaskState.NONE).count() == 15
    assert len(_jobs()) == 10
    # Unpaused, the next pass dispatches them, each once.
    type(dag).objects.filter(pk=dag.pk).update(paused=False)
    monkeypatch.setattr(run_advance, "dispatch_ready", real)
    schedule_once()
    _assert_dispatched_once(run)


# --- a report that makes a wide fan-out ready ------------------------------------------------------


def _root_reported(n: int):
    """A root and `n` tasks downstream of it; the root claimed, running, and its job gone from
    Redis: returns the run and the root, to be reported."""
    from orchestrator.engine import reporting

    dag = DagFactory(dag_id=f"fan{n}")
    TaskFactory(dag=dag, task_id="root", upstream=[])
    for i in range(n):
        TaskFactory(dag=dag, task_id=f"m{i:03d}", upstream=["root"])
    run = create_manual_run(dag)
    root = TaskInstance.objects.get(dag_run=run, task_id="root")
    worker = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)
    assert reporting.claim(root.pk, root.attempt_token, worker)
    assert reporting.mark_running(root.pk, root.attempt_token, pid=1)
    Queue("default", connection=get_redis()).empty()
    return run, root


def _middle_states(run) -> list[str]:
    return sorted(TaskInstance.objects.filter(dag_run=run).exclude(task_id="root").values_list("state", flat=True))


def test_a_reports_later_chunks_are_written_only_by_their_own_chunk(monkeypatch):
    """The report settles the 25 tasks its end made ready, dispatches the first chunk and commits
    without writing `scheduled` for the other 15: each later chunk moves its tasks from `none`
    to `queued` itself, once."""
    from orchestrator.engine import reporting

    run, root = _root_reported(25)
    seen: list[tuple[int, int, int, int]] = []  # (tasks in the chunk, none, scheduled, queued) as each chunk begins
    real = run_advance.dispatch_ready

    def watched(run, due, now, **options):
        states = _middle_states(run)
        seen.append((len(due), states.count(TaskState.NONE), states.count(TaskState.SCHEDULED), states.count(TaskState.QUEUED)))
        return real(run, due, now, **options)

    monkeypatch.setattr(run_advance, "dispatch_ready", watched)
    assert reporting.report_success(root.pk, root.attempt_token)
    assert seen == [(10, 25, 0, 0), (10, 15, 0, 10), (5, 5, 0, 20)]
    _assert_dispatched_once(run, but="root")


def test_a_failure_between_a_reports_chunks_leaves_the_rest_ready_for_the_next_pass(monkeypatch):
    """The report's second chunk fails before its commit: the report stands, its first chunk is
    on Redis, the other 15 tasks are still `none` with their upstream done, and the next
    scheduler pass settles and dispatches them, each once."""
    from orchestrator.engine import reporting

    run, root = _root_reported(25)
    real = _second_chunk_fails(monkeypatch)
    assert reporting.report_success(root.pk, root.attempt_token)
    assert _middle_states(run).count(TaskState.QUEUED) == 10
    assert _middle_states(run).count(TaskState.NONE) == 15
    assert len(_jobs()) == 10

    monkeypatch.setattr(run_advance, "dispatch_ready", real)
    schedule_once()
    _assert_dispatched_once(run, but="root")


def test_a_later_chunk_held_by_a_gate_that_closed_is_written_scheduled(monkeypatch):
    """The queue pauses (a storm) after the report's commit: the later chunks hold their tasks
    and write them `scheduled`, none left `none`, none dispatched; once the queue is free again
    the next pass dispatches them, each once."""
    from orchestrator.engine import reporting, storms

    run, root = _root_reported(25)
    sizes, _ = _at_chunk(
        monkeypatch, 2, lambda run: monkeypatch.setattr(storms, "paused_queues", lambda now: {"default"}), written=False
    )
    assert reporting.report_success(root.pk, root.attempt_token)
    assert sizes == [10, 10, 5]
    assert _middle_states(run) == [TaskState.QUEUED] * 10 + [TaskState.SCHEDULED] * 15
    assert len(_jobs()) == 10

    monkeypatch.undo()
    storms.forget()
    schedule_once()
    _assert_dispatched_once(run, but="root")


# --- the scheduler leaves a run to the dispatcher of its chunks -------------------------------------


def _marked(run) -> bool:
    from orchestrator.engine import enqueuing

    return bool(get_redis().exists(enqueuing.run_marker(run.pk)))


def test_a_runs_later_chunks_are_marked_while_they_go(monkeypatch):
    """The run is marked in Redis while its later chunks are dispatched, and no longer after."""
    dag = _wide_dag(25)
    marked: list[bool] = []
    real = run_advance.dispatch_ready

    def watched(run, due, now, **options):
        marked.append(_marked(run))
        return real(run, due, now, **options)

    monkeypatch.setattr(run_advance, "dispatch_ready", watched)
    run = create_manual_run(dag)
    assert marked == [False, True, True]  # the first chunk goes with the settling, unmarked
    assert not _marked(run)
    _assert_dispatched_once(run)


def test_the_scheduler_leaves_a_marked_run_to_its_dispatcher_until_the_marker_expires(monkeypatch):
    """A run whose dispatcher died between chunks: its marker holds the scheduler off (no pass
    reads the whole run to race a live dispatcher for the same tasks) until it expires; then
    the next pass dispatches the rest, each task once."""
    from orchestrator.engine import enqueuing

    dag = _wide_dag(25)

    def dying(run) -> None:
        get_redis().set(enqueuing.run_marker(run.pk), 1, px=800)  # what a live dispatcher left
        raise KeyboardInterrupt  # the process goes: nothing of this chunk, no cleanup of ours

    _, real = _at_chunk(monkeypatch, 2, dying, written=False)
    monkeypatch.setattr(run_advance, "_mark_dispatched", lambda run_id: None)  # it died: nothing removes the marker
    with pytest.raises(KeyboardInterrupt):
        create_manual_run(dag)
    monkeypatch.setattr(run_advance, "dispatch_ready", real)
    run = DagRun.objects.get(dag=dag)
    assert _marked(run)
    assert schedule_once().tasks_dispatched == 0
    assert TaskInstance.objects.filter(dag_run=run, state=TaskState.QUEUED).count() == CHUNK
    wait_until(lambda: not _marked(run), timeout=5, message="the dead dispatcher's marker to expire")
    schedule_once()
    _assert_dispatched_once(run)
