"""The results a task reads from its upstreams: as JSON text, and, on PostgreSQL, a large result a
worker read before is not read again while its row is unchanged, and is read again after any
change (real database, reports and actions made directly)."""
from __future__ import annotations

import json

import pytest
from django.db import connection, transaction

from orchestrator.engine import reporting, upstream
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.upstream import KEEP_FROM_CHARS, _KeptResults, results_json, upstream_results
from orchestrator.models import DagRun, TaskInstance
from orchestrator.operations import actions
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)
LARGE = [f"row-{i:05d}" for i in range(200)]  # 2.4 KB of JSON: large enough to keep
OTHER = [f"other-{i:05d}" for i in range(200)]


@pytest.fixture(autouse=True)
def nothing_kept():
    upstream._kept.clear()
    yield
    upstream._kept.clear()


def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite rows have no version: every read reads the results")


def _succeed(ti: TaskInstance, result=None) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    assert reporting.report_success(ti.pk, ti.attempt_token, result=result)


def _instance(run: DagRun, task_id: str, map_index: int = -1) -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id, map_index=map_index)


def _run_with_large_result(**downstream) -> DagRun:
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="extract")
    TaskFactory(dag=dag, task_id="report", upstream=["extract"], **downstream)
    run = create_manual_run(dag)
    _succeed(_instance(run, "extract"), result=LARGE)
    return run


def _pretend_kept(run: DagRun, task_id: str, text: str) -> None:
    """Change what this process kept of a task's result, where no other process can see it: a
    read that hands this on did not read the row."""
    ti = _instance(run, task_id)
    server = upstream._server_of(connection)
    (version, _), = upstream._kept.of(server, run.pk, [task_id]).values()
    upstream._kept.keep(server, run.pk, task_id, ti.pk, version, text)


def test_results_are_the_json_text_of_an_object_by_upstream_task_id():
    run = _run_with_large_result()
    assert json.loads(results_json(run.pk, ["extract", "gone"])) == {"extract": LARGE, "gone": None}
    assert results_json(run.pk, ["extract"], known={"extract": {"k": "v\n"}}) == '{"extract":{"k": "v\\n"}}'


def test_a_large_result_is_read_once_while_its_row_is_unchanged():
    _postgres_only()
    run = _run_with_large_result()
    assert upstream_results(run.pk, ["extract"]) == {"extract": LARGE}
    kept_instead = ["kept", "x" * KEEP_FROM_CHARS]
    _pretend_kept(run, "extract", json.dumps(kept_instead))
    assert upstream_results(run.pk, ["extract"]) == {"extract": kept_instead}


def test_any_change_to_the_row_reads_it_again():
    _postgres_only()
    run = _run_with_large_result()
    upstream_results(run.pk, ["extract"])
    _pretend_kept(run, "extract", json.dumps(["stale", "x" * KEEP_FROM_CHARS]))
    # Not even the result: any column written makes the row a new version.
    TaskInstance.objects.filter(dag_run=run, task_id="extract").update(pid=4242)
    assert upstream_results(run.pk, ["extract"]) == {"extract": LARGE}
    TaskInstance.objects.filter(dag_run=run, task_id="extract").update(result=OTHER)
    assert upstream_results(run.pk, ["extract"]) == {"extract": OTHER}


def test_a_result_marked_away_and_back_is_null_not_the_one_read_before(admin_user):
    """Marked failed (its result dropped), then marked success: same attempt token, no result."""
    run = _run_with_large_result(trigger_rule="all_done")
    assert upstream_results(run.pk, ["extract"]) == {"extract": LARGE}
    actions.mark_failed(_instance(run, "extract"), admin_user)
    actions.mark_success(_instance(run, "extract"), admin_user)
    assert upstream_results(run.pk, ["extract"]) == {"extract": None}


def test_a_cleared_task_run_again_hands_on_its_new_result(admin_user):
    run = _run_with_large_result()
    report = _instance(run, "report")
    claimed = reporting.claim(report.pk, report.attempt_token, WORKER)
    assert claimed is not None
    assert claimed.results == {"extract": LARGE}
    assert reporting.mark_running(report.pk, report.attempt_token, pid=1)
    assert reporting.report_success(report.pk, report.attempt_token)
    actions.clear(_instance(run, "extract"), admin_user, include_downstream=True)
    assert upstream_results(run.pk, ["extract"]) == {"extract": None}
    _succeed(_instance(run, "extract"), result=OTHER)
    report = _instance(run, "report")
    claimed = reporting.claim(report.pk, report.attempt_token, WORKER)
    assert claimed is not None
    assert claimed.results == {"extract": OTHER}


def test_a_result_read_in_a_transaction_that_rolled_back_is_not_handed_on():
    run = _run_with_large_result()

    def read_then_roll_back() -> None:
        with transaction.atomic():
            TaskInstance.objects.filter(dag_run=run, task_id="extract").update(result=OTHER)
            assert upstream_results(run.pk, ["extract"]) == {"extract": OTHER}
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError, match="roll back"):
        read_then_roll_back()
    assert upstream_results(run.pk, ["extract"]) == {"extract": LARGE}


def test_a_mapped_upstream_hands_on_its_instances_results_with_the_one_that_changed():
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="load", expand={"part": [0, 1, 2]})
    TaskFactory(dag=dag, task_id="report", upstream=["load"])
    run = create_manual_run(dag)
    from orchestrator.engine.run_advance import advance_run

    advance_run(run.pk)
    for index in range(3):
        _succeed(_instance(run, "load", index), result=[index, *LARGE])
    assert upstream_results(run.pk, ["load"]) == {"load": [[0, *LARGE], [1, *LARGE], [2, *LARGE]]}
    TaskInstance.objects.filter(dag_run=run, task_id="load", map_index=1).update(result=OTHER)
    assert upstream_results(run.pk, ["load"]) == {"load": [[0, *LARGE], OTHER, [2, *LARGE]]}


def test_what_a_worker_keeps_is_bounded_and_the_least_recently_read_goes_first():
    kept = _KeptResults(budget=3 * KEEP_FROM_CHARS)
    text = "[" + "1," * (KEEP_FROM_CHARS // 2) + "1]"
    kept.keep("s", 1, "a", 10, "v1", text)
    kept.keep("s", 1, "b", 11, "v1", text)
    kept.keep("s", 1, "tiny", 12, "v1", "[1]")  # too small to be worth keeping
    assert kept.of("s", 1, ["tiny"]) == {}
    kept.of("s", 1, ["a"])  # read: now the most recent
    kept.keep("s", 1, "c", 13, "v1", text)  # over the budget: "b" goes
    assert kept.of("s", 1, ["b"]) == {}
    assert set(kept.of("s", 1, ["a", "c"])) == {10, 13}
    kept.keep("s", 1, "a", 10, "v2", text)  # the row's new version replaces the old
    assert kept.of("s", 1, ["a"]) == {10: ("v2", text)}


def _rows_filtered_out(plan: dict) -> int:
    return int(plan.get("Rows Removed by Filter", 0)) + sum(_rows_filtered_out(p) for p in plan.get("Plans", []))


def test_an_upstream_of_a_wide_run_newer_than_the_statistics_is_read_by_its_key(settings):
    """The planner estimates a run it has no statistics for at one row: with an index on the run
    alone it read all of a mapped task's instances to find their upstream, for every claim."""
    _postgres_only()
    from django.test.utils import CaptureQueriesContext

    from orchestrator.engine.run_advance import advance_run

    settings.ORCHESTRATOR_MAX_MAP_LENGTH = 3000
    dag = DagFactory()
    TaskFactory(dag=dag, task_id="extract")
    TaskFactory(dag=dag, task_id="load", upstream=["extract"], expand={"part": "results.extract"})
    runs = []
    for _ in range(2):  # the first run's rows are analyzed; the second adds no more than those
        run = create_manual_run(dag)
        advance_run(run.pk)
        _succeed(_instance(run, "extract"), result=list(range(3000)))
        runs.append(run)
    assert TaskInstance.objects.filter(dag_run=runs[1], task_id="load").count() == 3000
    with CaptureQueriesContext(connection) as queries:
        upstream_results(runs[1].pk, ["extract"])
    (read,) = [q["sql"] for q in queries.captured_queries if "xmin" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + read)
        ((explained,),) = cursor.fetchall()
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    assert _rows_filtered_out(plan) < 10, json.dumps(plan, indent=1)
