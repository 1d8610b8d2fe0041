"""Results and mapped tasks through real workers, the scheduler's passes and the database."""
from __future__ import annotations

import json

import pytest

from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import DagRun, TaskInstance
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


def _by_task(run: DagRun) -> dict[str, list[TaskInstance]]:
    found: dict[str, list[TaskInstance]] = {}
    for ti in TaskInstance.objects.filter(dag_run=run).order_by("map_index"):
        found.setdefault(ti.task_id, []).append(ti)
    return found


def test_results_of_both_kinds_reach_downstream_tasks_and_templates(worker, make_dag):
    dag = make_dag([
        {"task_id": "summary", "python_callable": "tests.mapping.tasks.summary"},
        {"task_id": "shout", "upstream": ["summary"],
         "bash_command": 'echo noise; echo "{{ results.summary.n }} {{ results.summary }} {{ conf.day }}"; echo'},
        {"task_id": "collect", "python_callable": "tests.mapping.tasks.collect", "upstream": ["summary", "shout"]},
    ])
    worker()
    run = _finished(trigger(dag, conf={"day": "monday"}))
    assert run.state == "success"
    tis = {task_id: tis[0] for task_id, tis in _by_task(run).items()}
    assert tis["summary"].result == {"n": 3, "label": "three files"}
    assert tis["shout"].result == '3 {"n":3,"label":"three files"} monday'  # the last non-empty line
    assert tis["collect"].result == {
        "results": {"summary": {"n": 3, "label": "three files"}, "shout": tis["shout"].result}, "map_index": -1
    }
    document = run_document(run)
    assert [(t["task_id"], t["map_index"], t["result"]) for t in document["task_instances"]][0] == (
        "summary", -1, {"n": 3, "label": "three files"}
    )


def test_a_mapped_task_of_each_kind_runs_one_instance_per_item_and_downstream_gets_the_list(worker, make_dag):
    dag = make_dag([
        {"task_id": "files", "python_callable": "tests.mapping.tasks.files"},
        {"task_id": "load", "python_callable": "tests.mapping.tasks.load", "upstream": ["files"],
         "expand": {"path": "results.files"}},
        {"task_id": "count", "bash_command": 'echo "{{ map_index }}:{{ word }}"', "expand": {"word": ["a b", {"k": 1}]}},
        {"task_id": "collect", "python_callable": "tests.mapping.tasks.collect", "upstream": ["load", "count"]},
    ])
    worker()
    run = _finished(trigger(dag))
    assert run.state == "success"
    tis = _by_task(run)
    assert [ti.result for ti in tis["load"]] == [
        {"path": f"file-{i}.csv", "map_index": i} for i in range(3)
    ]
    assert [ti.result for ti in tis["count"]] == ["0:a b", '1:{"k":1}']
    assert tis["collect"][0].result["results"] == {
        "load": [ti.result for ti in tis["load"]], "count": ["0:a b", '1:{"k":1}']
    }
    document = run_document(run)
    assert [(t["task_id"], t["map_index"]) for t in document["task_instances"]] == [
        ("files", -1), ("load", 0), ("load", 1), ("load", 2), ("count", 0), ("count", 1), ("collect", -1)
    ]


def test_an_invalid_result_fails_the_attempt_charged_to_the_user_and_stores_nothing(worker, make_dag):
    dag = make_dag([
        {"task_id": "a_set", "python_callable": "tests.mapping.tasks.returns_a_set"},
        {"task_id": "too_much", "python_callable": "tests.mapping.tasks.returns_too_much"},
        {"task_id": "long_line", "bash_command": "head -c 70000 /dev/zero | tr '\\0' x; echo"},
    ], retries=1)
    worker()
    run = _finished(trigger(dag))
    assert run.state == "failed"
    for task_id, problem in (("a_set", "not_json"), ("too_much", "too_large"), ("long_line", "too_large")):
        (ti,) = _by_task(run)[task_id]
        assert ti.state == "failed", task_id
        assert ti.result is None, task_id
        assert ti.try_number == 2, task_id
        context = ti.last_failure_context
        assert (context["category"], context["reason"]) == ("application", "invalid_result")
        assert context["metadata"]["problem"] == problem, context
        assert [a.kind for a in ti.attempts.all()] == ["user", "user"]


def test_each_instance_of_a_mapped_task_keeps_its_own_task_state(worker, make_dag):
    """Task state is per task instance: every instance starts empty, writes its own keys, and
    gets its own idempotency key."""
    dag = make_dag([
        {"task_id": "remember", "python_callable": "tests.mapping.tasks.remember_item",
         "expand": {"item": ["a", "b", "c"]}},
    ])
    worker()
    run = _finished(trigger(dag))
    assert run.state == "success"
    instances = _by_task(run)["remember"]
    assert [ti.result["before"] for ti in instances] == [{}, {}, {}]
    assert len({ti.result["key"] for ti in instances}) == 3
    document = run_document(run)
    states = {t["map_index"]: t["task_state"] for t in document["task_instances"] if t["task_id"] == "remember"}
    assert states == {i: {"item": item, "map_index": i} for i, item in enumerate("abc")}


def test_instances_run_again_after_a_clear_are_handed_the_new_result_not_the_one_read_before(
    worker, make_dag, admin_user, tmp_path
):
    """A worker keeps a large result it read (not reading it again for each instance); cleared
    and run again, the source's new result is what every instance is handed."""
    from orchestrator.operations import actions

    source = tmp_path / "source.json"
    source.write_text(json.dumps([f"first-{i:05d}" for i in range(150)]))  # 2.3 KB: large enough to keep
    dag = make_dag([
        {"task_id": "source", "python_callable": "tests.mapping.tasks.read_list", "op_kwargs": {"path": str(source)}},
        {"task_id": "each", "python_callable": "tests.mapping.tasks.sees_source", "upstream": ["source"],
         "expand": {"item": "results.source"}},
    ])
    worker()
    run = _finished(trigger(dag))
    assert run.state == "success"
    assert {(ti.result["length"], ti.result["last"]) for ti in _by_task(run)["each"]} == {(150, "first-00149")}

    source.write_text(json.dumps([f"second-{i:05d}" for i in range(150)]))
    actions.clear(TaskInstance.objects.get(dag_run=run, task_id="source"), admin_user, include_downstream=True)
    run = _finished(run)
    assert run.state == "success"
    instances = _by_task(run)["each"]
    assert len(instances) == 150
    assert {(ti.result["length"], ti.result["last"]) for ti in instances} == {(150, "second-00149")}
