"""Clearing a mapped task's source with its downstream, through a real worker and the scheduler's
passes: the task expands over the source's new list, its instances past it are removed, and the
downstream receives the new results only."""
from __future__ import annotations

import json

import pytest

from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import DagRun, TaskInstance
from orchestrator.operations import actions
from orchestrator.operations.documents import run_document
from tests.conftest import wait_until
from tests.worker.conftest import trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _finished(run: DagRun, timeout: float = 60.0) -> DagRun:
    def done():
        schedule_once()
        current = DagRun.objects.get(pk=run.pk)
        return current if current.state in ("success", "failed") else None

    return wait_until(done, timeout=timeout, interval=0.1, message="the run to finish")


@pytest.mark.parametrize(("first", "second"), [(["a", "b", "c"], ["x", "y"]), (["a"], ["x", "y", "z"])])
def test_the_source_cleared_with_its_downstream_expands_the_task_over_its_new_list(worker, make_dag, admin_user, tmp_path, first, second):
    source = tmp_path / "source.json"
    source.write_text(json.dumps(first))
    dag = make_dag([
        {"task_id": "source", "python_callable": "tests.mapping.tasks.read_list", "op_kwargs": {"path": str(source)}},
        {"task_id": "load", "python_callable": "tests.mapping.tasks.load", "upstream": ["source"],
         "expand": {"path": "results.source"}},
        {"task_id": "collect", "python_callable": "tests.mapping.tasks.collect", "upstream": ["load"]},
    ])
    worker()
    run = _finished(trigger(dag))
    assert run.state == "success"

    source.write_text(json.dumps(second))
    actions.clear(TaskInstance.objects.get(dag_run=run, task_id="source"), admin_user, include_downstream=True)
    run = _finished(run)
    assert run.state == "success"
    loads = list(TaskInstance.objects.filter(dag_run=run, task_id="load").order_by("map_index"))
    ran = [ti for ti in loads if ti.state == "success"]
    assert [ti.result for ti in ran] == [{"path": item, "map_index": i} for i, item in enumerate(second)]
    assert [(ti.map_index, ti.state) for ti in loads if ti.state != "success"] == [
        (i, "removed") for i in range(len(second), len(first))
    ]
    collect = TaskInstance.objects.get(dag_run=run, task_id="collect")
    assert collect.result["results"] == {"load": [ti.result for ti in ran]}
    # Every attempt kept, each with the item it ran with.
    document = run_document(run)
    items = {t["map_index"]: [a["item"] for a in t["attempts"]] for t in document["task_instances"] if t["task_id"] == "load"}
    assert items == {
        i: first[i : i + 1] + second[i : i + 1] for i in range(max(len(first), len(second)))
    }
