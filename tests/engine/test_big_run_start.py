"""A big run (one whose table is analyzed once it is committed) starts from a chunk's worth of
rows: its first tasks without upstreams, highest priority first, are dispatched before the rest
of the run is read; then the whole run moves on as any other, each task dispatched once and no
task dispatched before its upstreams are done."""
from __future__ import annotations

import pytest
from django.db import connection
from rq import Queue

from orchestrator.engine import run_advance, tablestats
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import Task, TaskAttempt, TaskInstance, job_id_for
from retries.states import TaskState
from tests.engine.factories import DagFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

ROOTS = tablestats.ANALYZE_FROM_ROWS  # a run this big is analyzed after its commit
DOWNSTREAM = 20
URGENT = 7  # roots of a higher priority, created last


@pytest.fixture
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("a big run is analyzed, and started after its commit, on PostgreSQL only")


def _big_dag():
    dag = DagFactory(dag_id="big")
    tasks = [Task(dag=dag, task_id=f"r{i:04d}", bash_command="true", position=i, upstream=[]) for i in range(ROOTS)]
    tasks += [
        Task(dag=dag, task_id=f"u{i:02d}", bash_command="true", position=ROOTS + i, upstream=[], args={"priority_weight": 10})
        for i in range(URGENT)
    ]
    tasks += [
        Task(dag=dag, task_id=f"d{i:02d}", bash_command="true", position=ROOTS + URGENT + i, upstream=["r0000"], args={"priority_weight": 99})
        for i in range(DOWNSTREAM)
    ]
    Task.objects.bulk_create(tasks)
    return dag


def test_a_big_run_dispatches_its_first_chunk_before_reading_the_rest(postgresql_only, monkeypatch):
    dag = _big_dag()
    monkeypatch.setattr(run_advance, "FIRST_DISPATCH_CHUNK", 50)
    first_chunks: list[list[str]] = []
    whole_run_reads: list[int] = []  # how many rows each read of the whole run returned
    real_dispatch, real_read = run_advance.dispatch_ready, run_advance.instances_of

    def watched(run, due, now, **options):
        if not first_chunks:
            first_chunks.append([ti.task_id for ti in due])
            assert not whole_run_reads, "the whole run was read before its first dispatch"
            assert TaskInstance.objects.filter(dag_run=run).exclude(state=TaskState.NONE).count() == 0
        return real_dispatch(run, due, now, **options)

    def whole_run_read(run, *args, **kwargs):
        found = real_read(run, *args, **kwargs)
        whole_run_reads.append(len(found))
        return found

    monkeypatch.setattr(run_advance, "dispatch_ready", watched)
    monkeypatch.setattr(run_advance, "instances_of", whole_run_read)
    run = create_manual_run(dag)
    # The urgent roots first, then the others by their order; no task with an upstream.
    assert first_chunks[0] == [f"u{i:02d}" for i in range(URGENT)] + [f"r{i:04d}" for i in range(50 - URGENT)]
    # Then the whole run, read once: every root dispatched once, the downstream tasks wait for theirs.
    assert whole_run_reads == [ROOTS + URGENT + DOWNSTREAM]
    tis = {ti.task_id: ti for ti in TaskInstance.objects.filter(dag_run=run)}
    roots = [ti for task_id, ti in tis.items() if not task_id.startswith("d")]
    assert {(ti.state, ti.attempt_token) for ti in roots} == {(TaskState.QUEUED, 1)}
    assert {tis[f"d{i:02d}"].state for i in range(DOWNSTREAM)} == {TaskState.NONE}
    assert TaskAttempt.objects.filter(task_instance__dag_run=run).count() == len(roots)
    assert sorted(Queue("default", connection=get_redis()).job_ids) == sorted(job_id_for(ti.pk, 1) for ti in roots)


def test_a_big_run_whose_first_chunk_fails_is_started_whole(postgresql_only, monkeypatch, caplog):
    dag = _big_dag()
    monkeypatch.setattr(run_advance, "FIRST_DISPATCH_CHUNK", 50)

    def failing(run, now, unwritten):
        raise RuntimeError("injected: the first chunk's read failed")

    monkeypatch.setattr(run_advance, "_first_ready", failing)
    run = create_manual_run(dag)
    assert "could not start run" in caplog.text
    roots = TaskInstance.objects.filter(dag_run=run).exclude(task_id__startswith="d")
    assert {(ti.state, ti.attempt_token) for ti in roots} == {(TaskState.QUEUED, 1)}
