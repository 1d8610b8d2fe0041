"""Operator actions on a mapped task's instances: one ({"map_index": N}) or every one (each
audited), through the API and the task page; the grid cell and the page's list of instances."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import AuditLog, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _finish(ti: TaskInstance, *, fail: bool) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    if fail:
        context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="ValueError")
        assert reporting.report_failure(ti.pk, ti.attempt_token, context, fingerprint="abcabcabcabc")
    else:
        assert reporting.report_success(ti.pk, ti.attempt_token, result={"n": ti.map_index})


@pytest.fixture
def run():
    """load over [0, 1, 2]: instance 1 failed, the others succeeded (no retries)."""
    dag = DagFactory(dag_id="mapped", default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="load", expand={"n": [0, 1, 2]})
    run = create_manual_run(dag)
    for ti in TaskInstance.objects.filter(dag_run=run).order_by("map_index"):
        _finish(ti, fail=ti.map_index == 1)
    return run


def _url(run, action: str) -> str:
    return f"/api/v1/dags/mapped/runs/{quote(run.run_id, safe='')}/tasks/load/{action}"


def _states(run) -> list[str]:
    return list(TaskInstance.objects.filter(dag_run=run).order_by("map_index").values_list("state", flat=True))


def test_an_action_with_a_map_index_acts_on_that_instance_alone(alice_client, run):
    response = alice_client.post(_url(run, "clear"), {"map_index": 1, "note": "again"}, content_type="application/json")
    assert response.status_code == 200, response.json()
    assert _states(run) == ["success", "queued", "success"]
    (entry,) = AuditLog.objects.filter(action="clear")
    assert entry.task_id == "load"
    assert entry.details["map_index"] == 1
    assert entry.prior_state == "failed"
    document = response.json()
    assert [(t["map_index"], t["result"]) for t in document["task_instances"]] == [(0, {"n": 0}), (1, None), (2, {"n": 2})]


def test_an_action_without_a_map_index_acts_on_every_instance_each_audited(alice_client, run):
    response = alice_client.post(_url(run, "mark_failed"), {"note": "bad data"}, content_type="application/json")
    assert response.status_code == 200
    assert _states(run) == ["failed", "failed", "failed"]
    # The failed one was refused (already failed); the other two were each audited.
    assert sorted(e.details["map_index"] for e in AuditLog.objects.filter(action="mark_failed")) == [0, 2]


def test_an_unknown_map_index_or_a_bad_one_is_refused(alice_client, bob_client, run):
    assert alice_client.post(_url(run, "clear"), {"map_index": 7}, content_type="application/json").status_code == 404
    bad = alice_client.post(_url(run, "clear"), {"map_index": -2}, content_type="application/json")
    assert bad.status_code == 400
    assert "map_index" in bad.json()["error"]
    assert alice_client.post(_url(run, "clear"), {"map_index": "1"}, content_type="application/json").status_code == 400
    assert bob_client.post(_url(run, "clear"), {"map_index": 1}, content_type="application/json").status_code == 403
    assert _states(run) == ["success", "failed", "success"]
    assert not AuditLog.objects.exists()


def test_reclassify_gives_one_instance_its_retry_back(alice_client, run):
    response = alice_client.post(_url(run, "reclassify"), {"map_index": 1}, content_type="application/json")
    assert response.status_code == 200
    ti = TaskInstance.objects.get(dag_run=run, map_index=1)
    assert ti.state in (TaskState.SCHEDULED, TaskState.QUEUED)
    assert ti.infrastructure_try_number == 1


def test_the_task_page_lists_the_instances_filters_them_and_clears_the_failed_ones(alice_client, run):
    page_url = f"/dags/mapped/runs/{quote(run.run_id, safe='')}/tasks/load"
    page = alice_client.get(page_url).content.decode()
    assert "3 instances: 1 failed, 2 success" in page
    assert 'data-map-index="2"' in page
    filtered = alice_client.get(page_url + "?state=failed").content.decode()
    assert 'data-map-index="1"' in filtered
    assert 'data-map-index="0"' not in filtered
    one = alice_client.get(page_url + "?map_index=0").content.decode()
    assert "load[0]" in one
    assert "&quot;n&quot;: 0" in one
    response = alice_client.post(page_url + "/clear", {"scope": "failed", "back": "task", "confirmed": "1"})
    assert response.status_code == 303
    assert _states(run) == ["success", "queued", "success"]
    assert [e.details["map_index"] for e in AuditLog.objects.filter(action="clear")] == [1]


def test_the_grid_shows_one_cell_with_counts_in_the_worst_state(alice_client, run):
    page = alice_client.get("/dags/mapped/").content.decode()
    assert 'class="sq state-failed' in page
    assert "load: 3 instances: 1 failed, 2 success" in page
