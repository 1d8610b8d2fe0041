"""Pools and limits without workers: commands, spec keys, admission order, waiting_for in the run document."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_run
from orchestrator.engine.transitions import transition
from orchestrator.models import Dag, DagRun, Pool, Task, TaskInstance
from orchestrator.specs.errors import SpecError
from orchestrator.specs.exporter import export_yaml
from orchestrator.specs.importer import import_paths
from tests.api.personas import alice, alice_client, fast_password_hasher  # noqa: F401

pytestmark = pytest.mark.django_db

CALLABLE = "tests.worker.tasks.succeed"


def _run(dag: Dag, minutes_ago: int = 0) -> DagRun:
    when = timezone.now() - timedelta(minutes=minutes_ago)
    return create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=when, now=when)


def _dag(dag_id: str, tasks: dict[str, dict], **fields) -> Dag:
    dag = Dag.objects.create(dag_id=dag_id, max_active_runs=100, **fields)
    for position, (task_id, args) in enumerate(tasks.items()):
        Task.objects.create(dag=dag, task_id=task_id, python_callable=CALLABLE, args=args, position=position)
    return dag


def test_set_pool_creates_and_resizes_and_list_pools_prints_them():
    out = StringIO()
    call_command("set_pool", "warehouse", "4", "--description", "the warehouse", stdout=out)
    call_command("set_pool", "api", "2", stdout=out)
    call_command("set_pool", "warehouse", "6", stdout=out)
    assert Pool.objects.get(name="warehouse").slots == 6
    assert Pool.objects.get(name="warehouse").description == "the warehouse"
    listing = StringIO()
    call_command("list_pools", stdout=listing)
    assert listing.getvalue().splitlines() == ["api 2", "warehouse 6"]


def test_an_unknown_pool_is_an_import_error_naming_file_dag_task_and_value(tmp_path: Path):
    spec = tmp_path / "dag.yaml"
    spec.write_text(f"dag_id: etl\ntasks:\n  - task_id: load\n    python_callable: {CALLABLE}\n    pool: nowhere\n")
    with pytest.raises(SpecError) as error:
        import_paths([spec])
    message = str(error.value)
    assert str(spec) in message
    assert "'etl'" in message
    assert "'load'" in message
    assert "'nowhere'" in message
    assert not Dag.objects.exists()


def test_limit_keys_round_trip_through_export(tmp_path: Path):
    Pool.objects.create(name="warehouse", slots=2)
    spec = tmp_path / "dag.yaml"
    spec.write_text(
        "dag_id: etl\nmax_active_tasks: 3\ntasks:\n"
        f"  - task_id: load\n    python_callable: {CALLABLE}\n    pool: warehouse\n    pool_slots: 2\n"
        "    priority_weight: 7\n    max_active_tis_per_dag: 1\n    circuit: payments-api\n"
    )
    assert import_paths([spec]).created == ["etl"]
    exported = export_yaml(["etl"])
    assert "max_active_tasks: 3" in exported
    assert "circuit: payments-api" in exported
    again = tmp_path / "again.yaml"
    again.write_text(exported)
    assert import_paths([again]).unchanged == ["etl"]


def test_bad_limit_values_are_refused(tmp_path: Path):
    spec = tmp_path / "dag.yaml"
    spec.write_text(
        "dag_id: etl\nmax_active_tasks: 0\ntasks:\n"
        f"  - task_id: load\n    python_callable: {CALLABLE}\n    pool_slots: 0\n    max_active_tis_per_dag: -1\n"
    )
    with pytest.raises(SpecError) as error:
        import_paths([spec])
    message = str(error.value)
    assert "max_active_tasks" in message
    assert "pool_slots" in message
    assert "max_active_tis_per_dag" in message


def test_a_full_pool_holds_the_task_and_the_run_document_says_why(alice_client):  # noqa: F811
    Pool.objects.create(name="warehouse", slots=1)
    dag = _dag("etl", {"load": {"pool": "warehouse"}})
    first, second = _run(dag, minutes_ago=2), _run(dag, minutes_ago=1)
    advance_run(first.pk)
    advance_run(second.pk)
    assert TaskInstance.objects.get(dag_run=first).state == "queued"
    held = TaskInstance.objects.get(dag_run=second)
    assert held.state == "scheduled"
    assert held.try_number == 0
    assert held.waiting_for["kind"] == "pool"
    assert held.waiting_for["name"] == "warehouse"
    doc = alice_client.get(f"/api/v1/dags/etl/runs/{second.run_id}").json()
    assert doc["task_instances"][0]["waiting_for"] == held.waiting_for
    pools = alice_client.get("/api/v1/pools").json()["pools"]
    assert pools == [{"name": "warehouse", "slots": 1, "description": "", "used": 1, "waiting": 1}]


def test_a_freed_slot_goes_to_the_highest_priority_then_the_oldest_run():
    Pool.objects.create(name="warehouse", slots=1)
    backfill = _dag("backfill", {"load": {"pool": "warehouse"}})
    today = _dag("today", {"load": {"pool": "warehouse", "priority_weight": 10}})
    holder_run = _run(backfill, minutes_ago=10)
    advance_run(holder_run.pk)
    holder = TaskInstance.objects.get(dag_run=holder_run)
    assert holder.state == "queued"
    old_backfill = _run(backfill, minutes_ago=9)
    new_backfill = _run(backfill, minutes_ago=8)
    todays = _run(today, minutes_ago=1)
    for run in (new_backfill, old_backfill, todays):
        advance_run(run.pk)
    assert TaskInstance.objects.filter(state="queued").count() == 1

    def release(ti: TaskInstance) -> None:
        assert transition(ti.pk, expected=["queued"], token=ti.attempt_token, state="success", end_date=timezone.now())

    order = []
    for _ in range(3):
        release(TaskInstance.objects.get(state="queued"))
        # Whichever run moves on, the slot goes to the best-ranked waiter of any run.
        advance_run(new_backfill.pk)
        advance_run(old_backfill.pk)
        advance_run(todays.pk)
        order.append(TaskInstance.objects.get(state="queued").dag_run_id)
    assert order == [todays.pk, old_backfill.pk, new_backfill.pk]


def test_max_active_tasks_and_max_active_tis_per_dag_hold_tasks():
    dag = _dag("etl", {"a": {}, "b": {}, "c": {"max_active_tis_per_dag": 1}}, max_active_tasks=2)
    run = _run(dag)
    advance_run(run.pk)
    states = dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))
    assert sorted(states.values()) == ["queued", "queued", "scheduled"]
    waiting = TaskInstance.objects.get(dag_run=run, state="scheduled")
    assert waiting.waiting_for["kind"] == "max_active_tasks"
    assert waiting.waiting_for["name"] == "etl"
    dag.max_active_tasks = None
    dag.save()
    other = _run(dag)
    advance_run(run.pk)
    advance_run(other.pk)
    held = TaskInstance.objects.get(dag_run=other, task_id="c")
    assert held.state == "scheduled"
    assert held.waiting_for["kind"] == "max_active_tis_per_dag"
    assert held.waiting_for["name"] == "c"
