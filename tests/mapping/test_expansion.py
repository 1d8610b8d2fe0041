"""Mapped tasks in the engine: expansion once, skipped on an empty list, invalid_expand, results
handed downstream in map_index order, and max_active_tis_per_dagrun (real database and Redis,
reports made directly)."""
from __future__ import annotations

import pytest

from orchestrator.engine import reporting
from orchestrator.engine.mapping import expand_ready, expansion_of
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.run_reads import instances_of
from orchestrator.engine.upstream import upstream_results
from orchestrator.models import DagRun, TaskInstance
from retries.states import TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _succeed(ti: TaskInstance, result=None) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    assert reporting.report_success(ti.pk, ti.attempt_token, result=result)


def _instances(run: DagRun, task_id: str) -> list[TaskInstance]:
    return list(TaskInstance.objects.filter(dag_run=run, task_id=task_id).order_by("map_index"))


def _mapped_dag(source, *, downstream_rule: str = "all_success", **load_args):
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="extract")
    TaskFactory(dag=dag, task_id="load", upstream=["extract"], expand={"path": source}, args=load_args)
    TaskFactory(dag=dag, task_id="report", upstream=["load"], trigger_rule=downstream_rule)
    return dag


def test_it_expands_over_an_upstream_list_once_and_hands_the_results_downstream_in_order():
    run = create_manual_run(_mapped_dag("results.extract"))
    (placeholder,) = _instances(run, "load")
    assert placeholder.map_index == -1
    assert placeholder.state == TaskState.NONE
    _succeed(_instances(run, "extract")[0], result=["a", "b", "c"])

    load = _instances(run, "load")
    assert [(ti.map_index, ti.map_item, ti.state) for ti in load] == [
        (0, "a", TaskState.QUEUED), (1, "b", TaskState.QUEUED), (2, "c", TaskState.QUEUED)
    ]
    assert load[0].pk == placeholder.pk  # the placeholder became instance 0
    advance_run(run.pk)  # a second pass expands nothing again
    assert len(_instances(run, "load")) == 3

    # The downstream waits for every instance, then reads their results in map_index order.
    for ti in reversed(load[1:]):
        _succeed(ti, result=f"loaded {ti.map_item}")
    assert _instances(run, "report")[0].state == TaskState.NONE
    _succeed(load[0], result="loaded a")
    assert _instances(run, "report")[0].state == TaskState.QUEUED
    assert upstream_results(run.pk, ["load", "extract"]) == {
        "load": ["loaded a", "loaded b", "loaded c"], "extract": ["a", "b", "c"]
    }
    claimed = reporting.claim(_instances(run, "report")[0].pk, 1, WORKER)
    assert claimed.results == {"load": ["loaded a", "loaded b", "loaded c"]}
    assert claimed.map_index == -1


def test_a_claimed_instance_gets_its_item_by_its_name():
    run = create_manual_run(_mapped_dag(["x", {"k": 1}]))
    second = _instances(run, "load")  # a literal expands as soon as its upstream succeeded
    assert second[0].state == TaskState.NONE
    _succeed(_instances(run, "extract")[0])
    second = _instances(run, "load")[1]
    claimed = reporting.claim(second.pk, second.attempt_token, WORKER)
    assert claimed.map_index == 1
    assert claimed.mapped == {"path": {"k": 1}}


def test_an_expansion_that_lost_the_race_changes_nothing():
    """Two processes that read the placeholder `none` both try: the fenced move lets one win."""
    run = create_manual_run(_mapped_dag([1, 2, 3]))
    _succeed(_instances(run, "extract")[0])
    # A second expander holding the stale read of the placeholder (token 0, state none).
    stale = TaskInstance.objects.get(pk=_instances(run, "load")[0].pk)
    stale.state, stale.map_index = TaskState.NONE, -1
    stale.dag_run = run
    assert expand_ready(stale, stale.updated_at) is None
    assert len(_instances(run, "load")) == 3


@pytest.mark.parametrize(
    ("rule", "expected"), [("all_success", TaskState.SKIPPED), ("none_failed", TaskState.QUEUED), ("all_done", TaskState.QUEUED)]
)
def test_an_empty_list_skips_the_task_and_trigger_rules_read_it_as_airflow_does(rule, expected):
    run = create_manual_run(_mapped_dag("results.extract", downstream_rule=rule))
    _succeed(_instances(run, "extract")[0], result=[])
    (load,) = _instances(run, "load")
    assert (load.map_index, load.state) == (-1, TaskState.SKIPPED)
    assert _instances(run, "report")[0].state == expected
    assert upstream_results(run.pk, ["load"]) == {"load": []}


@pytest.mark.parametrize(
    ("result", "got"), [({"a": 1}, "dict"), ("abc", "str"), (None, "null"), (list(range(6)), "list")]
)
def test_a_source_that_is_not_a_list_or_too_long_fails_the_task_at_once(settings, result, got):
    settings.ORCHESTRATOR_MAX_MAP_LENGTH = 5
    run = create_manual_run(_mapped_dag("results.extract"))
    _succeed(_instances(run, "extract")[0], result=result)
    (load,) = _instances(run, "load")
    assert load.state == TaskState.FAILED
    assert load.try_number == 0
    context = load.last_failure_context
    assert (context["category"], context["reason"]) == ("application", "invalid_expand")
    assert context["metadata"]["got_type"] == got
    assert "results.extract" in context["metadata"]["detail"]
    if got == "list":
        assert context["metadata"]["length"] == 6
        assert context["metadata"]["max_length"] == 5
    assert _instances(run, "report")[0].state == TaskState.UPSTREAM_FAILED
    assert DagRun.objects.get(pk=run.pk).state == "failed"


def test_the_rule_names_what_it_got():
    assert expansion_of("results.x", 7, 10).problem["detail"] == "results.x is not a list but int"
    assert expansion_of([1], [1], 10).items == [1]


def test_max_active_tis_per_dagrun_caps_the_instances_queued_at_once():
    run = create_manual_run(_mapped_dag(list(range(5)), max_active_tis_per_dagrun=2))
    _succeed(_instances(run, "extract")[0])
    states = [ti.state for ti in _instances(run, "load")]
    assert states.count(TaskState.QUEUED) == 2
    assert states.count(TaskState.SCHEDULED) == 3
    held = [ti for ti in _instances(run, "load") if ti.state == TaskState.SCHEDULED]
    assert all(ti.waiting_for["kind"] == "max_active_tis_per_dag" for ti in held)  # the contract's kinds
    assert all(ti.waiting_for["name"] == ti.task_id for ti in held)
    _succeed(next(ti for ti in _instances(run, "load") if ti.state == TaskState.QUEUED))
    states = [ti.state for ti in _instances(run, "load")]
    assert states.count(TaskState.QUEUED) == 2
    assert states.count(TaskState.SUCCESS) == 1


def test_advance_run_does_not_read_results():
    """Results can be large: the run's every move reads its instances without them."""
    run = create_manual_run(_mapped_dag([1]))
    ti = instances_of(run)[0]
    assert "result" in ti.get_deferred_fields()
    assert "map_item" in ti.get_deferred_fields()


def test_a_big_expansion_leaves_statistics_that_know_its_rows(settings):
    """1,500 instances at once, and as many attempts dispatched: both tables are analyzed once
    committed, so that prepared moves planned while they were tiny are planned again
    (`engine/tablestats.py`)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("planner statistics are PostgreSQL's")

    def known_rows() -> list[float]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples FROM pg_class WHERE oid IN ('orchestrator_taskinstance'::regclass, 'orchestrator_taskattempt'::regclass)"
            )
            return [reltuples for (reltuples,) in cursor.fetchall()]

    settings.ORCHESTRATOR_MAX_MAP_LENGTH = 2000
    run = create_manual_run(_mapped_dag("results.extract"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE orchestrator_taskinstance")
        cursor.execute("ANALYZE orchestrator_taskattempt")
    assert all(rows < 100 for rows in known_rows())
    _succeed(_instances(run, "extract")[0], result=list(range(1500)))
    assert len(_instances(run, "load")) == 1500
    assert all(rows >= 1500 for rows in known_rows()), known_rows()
