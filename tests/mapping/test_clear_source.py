"""Clearing a mapped task's source with its downstream makes the task unexpanded again (one entry,
map_index -1, state none, the instances' attempts kept), and the source's next success expands it
over the new list: instances 0..n-1 run over the new items, those of a longer old list past n
become `removed` (history kept and shown, out of trigger rules and results). Clearing the mapped
task itself runs each instance again over its own item; a list literal keeps its items."""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from orchestrator.engine import reporting
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.upstream import upstream_results
from orchestrator.models import DagRun, TaskAttempt, TaskInstance
from orchestrator.operations import actions
from orchestrator.operations.documents import run_document
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _end(ti: TaskInstance, result: Any = None, *, fail: bool = False) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    if fail:
        context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="ValueError")
        assert reporting.report_failure(ti.pk, ti.attempt_token, context, fingerprint="abcabcabcabc")
    else:
        assert reporting.report_success(ti.pk, ti.attempt_token, result=result)


def _run_queued(run: DagRun, task_id: str, result: Any = None, *, fail_index: int | None = None) -> None:
    """Every queued instance of the task run to its end, as a worker reports it: a mapped
    instance returns `{"seen": its item}` (instance `fail_index` fails instead)."""
    for ti in TaskInstance.objects.filter(dag_run=run, task_id=task_id, state=TaskState.QUEUED).order_by("map_index"):
        mapped = ti.map_index >= 0
        _end(ti, {"seen": ti.map_item} if mapped else result, fail=mapped and ti.map_index == fail_index)


def _entries(run: DagRun, task_id: str) -> list[tuple[int, str, list[Any]]]:
    """The run document's entries of a task: (map_index, state, the items of its attempts)."""
    document = run_document(DagRun.objects.get(pk=run.pk))
    return [
        (t["map_index"], t["state"], [a["item"] for a in t["attempts"]])
        for t in document["task_instances"] if t["task_id"] == task_id
    ]


def _dag(downstream_rule: str = "all_success"):
    dag = DagFactory(dag_id="remap", default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="source")
    TaskFactory(dag=dag, task_id="each", upstream=["source"], expand={"item": "results.source"})
    TaskFactory(dag=dag, task_id="collect", upstream=["each"], trigger_rule=downstream_rule)
    return dag


def _ran_over(items: list[Any], *, fail_index: int | None = None, downstream_rule: str = "all_success") -> DagRun:
    run = create_manual_run(_dag(downstream_rule))
    advance_run(run.pk)
    _run_queued(run, "source", items)
    _run_queued(run, "each", fail_index=fail_index)
    _run_queued(run, "collect", "collected")
    return run


def _clear_source(run: DagRun, user) -> None:
    actions.clear(TaskInstance.objects.get(dag_run=run, task_id="source"), user, include_downstream=True)


def _state(run: DagRun) -> str:
    return DagRun.objects.get(pk=run.pk).state


def test_clearing_the_source_with_its_downstream_unexpands_the_task_keeping_its_attempts(alice):
    run = _ran_over(["a", "b", "c"])
    assert _state(run) == "success"
    _clear_source(run, alice)
    # One entry, map_index -1, state none, with every attempt of the former instances.
    ((map_index, state, items),) = _entries(run, "each")
    assert (map_index, state) == (-1, "none")
    assert sorted(items) == ["a", "b", "c"]
    assert TaskAttempt.objects.filter(task_instance__dag_run=run, task_instance__task_id="each").count() == 3
    assert TaskInstance.objects.get(dag_run=run, task_id="collect").state == TaskState.NONE
    assert _state(run) == "running"


def test_a_shorter_list_runs_the_new_items_and_removes_the_instances_past_it(alice):
    run = _ran_over(["a", "b", "c"])
    _clear_source(run, alice)
    _run_queued(run, "source", ["x", "y"])
    queued = TaskInstance.objects.filter(dag_run=run, task_id="each", state=TaskState.QUEUED).order_by("map_index")
    assert [(ti.map_index, ti.map_item) for ti in queued] == [(0, "x"), (1, "y")]
    # Each instance keeps its history, every attempt saying which item it ran with.
    assert _entries(run, "each") == [(0, "queued", ["a", "x"]), (1, "queued", ["b", "y"]), (2, "removed", ["c"])]
    _run_queued(run, "each")
    # The removed instance is neither waited for nor among the results.
    assert upstream_results(run.pk, ["each"]) == {"each": [{"seen": "x"}, {"seen": "y"}]}
    assert TaskInstance.objects.get(dag_run=run, task_id="collect").state == TaskState.QUEUED
    _run_queued(run, "collect", "again")
    assert _state(run) == "success"


def test_a_removed_instance_takes_no_part_in_trigger_rules(alice):
    """Instance 2 failed (collect upstream_failed); over a list of two it is removed, and
    collect runs once instances 0 and 1 succeeded."""
    run = _ran_over(["a", "b", "c"], fail_index=2)
    assert TaskInstance.objects.get(dag_run=run, task_id="collect").state == TaskState.UPSTREAM_FAILED
    assert _state(run) == "failed"
    _clear_source(run, alice)
    _run_queued(run, "source", ["x", "y"])
    _run_queued(run, "each")
    assert [ti.state for ti in TaskInstance.objects.filter(dag_run=run, task_id="each").order_by("map_index")] == [
        "success", "success", "removed"
    ]
    assert TaskInstance.objects.get(dag_run=run, task_id="collect").state == TaskState.QUEUED
    _run_queued(run, "collect", "done")
    assert _state(run) == "success"


def test_a_longer_list_adds_instances_after_the_old_ones(alice):
    run = _ran_over(["a"])
    _clear_source(run, alice)
    _run_queued(run, "source", ["x", "y", "z"])
    assert _entries(run, "each") == [(0, "queued", ["a", "x"]), (1, "queued", ["y"]), (2, "queued", ["z"])]
    _run_queued(run, "each")
    assert upstream_results(run.pk, ["each"]) == {"each": [{"seen": "x"}, {"seen": "y"}, {"seen": "z"}]}
    _run_queued(run, "collect", "again")
    assert _state(run) == "success"


@pytest.mark.parametrize(("rule", "collect_state"), [("all_success", "skipped"), ("none_failed", "queued")])
def test_an_empty_list_skips_the_task_and_removes_every_old_instance(alice, rule, collect_state):
    run = _ran_over(["a", "b"], downstream_rule=rule)
    _clear_source(run, alice)
    _run_queued(run, "source", [])
    assert _entries(run, "each") == [(-1, "skipped", ["a"]), (1, "removed", ["b"])]
    assert upstream_results(run.pk, ["each"]) == {"each": []}
    assert TaskInstance.objects.get(dag_run=run, task_id="collect").state == collect_state


def test_unexpanded_twice_then_expanded_keeps_every_attempt(alice):
    run = _ran_over(["a", "b", "c"])
    _clear_source(run, alice)
    _run_queued(run, "source", [])  # skipped: b and c removed
    _clear_source(run, alice)
    ((_, state, items),) = _entries(run, "each")
    assert state == "none"
    assert sorted(items) == ["a", "b", "c"]
    _run_queued(run, "source", ["x", "y", "z", "w"])
    assert _entries(run, "each") == [
        (0, "queued", ["a", "x"]), (1, "queued", ["b", "y"]), (2, "queued", ["c", "z"]), (3, "queued", ["w"])
    ]


def test_clearing_one_instance_or_every_one_runs_each_over_its_own_item(alice):
    run = _ran_over(["a", "b", "c"])
    _clear_source(run, alice)
    _run_queued(run, "source", ["x", "y"])
    _run_queued(run, "each")
    _run_queued(run, "collect", "done")
    actions.act_on_task("clear", actions.find_task_instances("remap", run.run_id, "each", 1), alice)
    assert _entries(run, "each")[1] == (1, "queued", ["b", "y", "y"])
    _run_queued(run, "each")
    # Every instance: the removed one is left alone.
    actions.act_on_task("clear", actions.find_task_instances("remap", run.run_id, "each"), alice)
    assert _entries(run, "each") == [
        (0, "queued", ["a", "x", "x"]), (1, "queued", ["b", "y", "y", "y"]), (2, "removed", ["c"])
    ]


def test_a_removed_instance_is_refused_any_action(alice):
    run = _ran_over(["a", "b", "c"])
    _clear_source(run, alice)
    _run_queued(run, "source", ["x"])
    removed = actions.find_task_instances("remap", run.run_id, "each", 2)
    for action in ("clear", "mark_success", "mark_failed"):
        with pytest.raises(actions.Conflict):
            actions.act_on_task(action, removed, alice)
    assert TaskInstance.objects.get(dag_run=run, task_id="each", map_index=2).state == TaskState.REMOVED


def test_a_task_mapped_over_a_list_literal_keeps_its_items(alice):
    dag = DagFactory(dag_id="literal", default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="first")
    TaskFactory(dag=dag, task_id="each", upstream=["first"], expand={"item": ["p", "q"]})
    run = create_manual_run(dag)
    advance_run(run.pk)
    _run_queued(run, "first", "one")
    _run_queued(run, "each")
    actions.clear(TaskInstance.objects.get(dag_run=run, task_id="first"), alice, include_downstream=True)
    assert _entries(run, "each") == [(0, "none", ["p"]), (1, "none", ["q"])]
    _run_queued(run, "first", "two")
    assert _entries(run, "each") == [(0, "queued", ["p", "p"]), (1, "queued", ["q", "q"])]


def test_the_task_pages_show_the_history_of_an_unexpanded_task_and_of_a_removed_instance(alice, alice_client):
    run = _ran_over(["a", "bee", "cee"])
    _clear_source(run, alice)
    url = f"/dags/remap/runs/{quote(run.run_id, safe='')}/tasks/each"
    page = alice_client.get(url).content.decode()
    shown = [s.split("</code>")[0] for s in page.split('class="attempt-item"><code>')[1:]]
    assert sorted(shown) == ["&quot;a&quot;", "&quot;bee&quot;", "&quot;cee&quot;"]
    _run_queued(run, "source", ["x"])
    removed = alice_client.get(url + "?map_index=2").content.decode()
    assert "each[2]" in removed
    assert "&quot;cee&quot;" in removed
    overview = alice_client.get(url).content.decode()
    assert "3 instances: 1 queued, 2 removed" in overview
