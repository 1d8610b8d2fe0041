"""A history with an audit entry of every kind of action, for the audit log's readers."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User

from orchestrator.engine import clearing
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import Circuit, DagRun, TaskInstance
from orchestrator.operations import actions, backfills
from tests.api.factories import chain_dag, fail_until_failed, instance, make_run
from tests.api.personas import (  # noqa: F401
    alice,
    alice_client,
    anonymous_client,
    bob,
    bob_client,
    fast_password_hasher,
)
from tests.engine.factories import DagFactory, TaskFactory


@dataclass
class History:
    run: DagRun  # etl's run: extract marked success, load marked failed then cleared
    other: DagRun  # etl's second run: extract reclassified, then re-run by a backfill
    mapped: DagRun  # mapped's run: instance 1 of load marked failed


@pytest.fixture
def history(alice: User) -> History:  # noqa: F811
    """One entry of each kind, oldest first: trigger, mark_success, mark_failed, clear,
    reclassify, circuit_open, circuit_probe, circuit_close, backfill_create, backfill_pause,
    backfill_unpause, backfill_cancel, backfill_rerun (with a clear of each task it re-runs), and
    mark_failed on a mapped instance."""
    dag = chain_dag("etl", task_ids=("extract", "load"), retries=0)
    dag.schedule = "@daily"
    dag.save()
    run = actions.trigger(dag, alice, conf={"day": 1})
    fail_until_failed(run, "extract")
    actions.mark_success(instance(run, "extract"), alice, note="checked by hand")
    actions.mark_failed(instance(run, "load"), alice, note="stop")
    actions.clear(instance(run, "load"), alice, note="once more")

    other = make_run(dag)
    fail_until_failed(other, "extract")
    actions.reclassify(instance(other, "extract"), alice, note="node drain")

    circuit = Circuit.objects.create(name="payments-api")
    for action in ("open", "probe", "close"):
        circuit.refresh_from_db()
        actions.operate_circuit(circuit, action, alice, note=f"{action} it")

    backfill = backfills.create(backfills.check(dag, start="2026-03-27", end="2026-03-28"), alice)
    for action in ("pause", "unpause", "cancel"):
        backfill = backfills.act(backfill, action, alice)
    fail_until_failed(other, "extract")
    clearing.clear_for_rerun(other, ["failed", "upstream_failed"], by="alice", note="backfill")

    mapped_dag = DagFactory(dag_id="mapped", default_args={"retries": 0})
    TaskFactory(dag=mapped_dag, task_id="load", expand={"n": [10, 11, 12]})
    mapped = create_manual_run(mapped_dag)
    advance_run(mapped.pk)  # what the trigger's commit does: the task expands
    actions.mark_failed(TaskInstance.objects.get(dag_run=mapped, task_id="load", map_index=1), alice, note="bad item")
    return History(run, other, mapped)


ACTIONS_OLDEST_FIRST = [
    "trigger", "mark_success", "mark_failed", "clear", "reclassify",
    "circuit_open", "circuit_probe", "circuit_close",
    "backfill_create", "backfill_pause", "backfill_unpause", "backfill_cancel", "backfill_rerun", "clear", "clear",
    "mark_failed",
]
