"""An operator reads a mapped task in a real browser: the grid's one cell, the instances listed
and filtered, one instance's result (escaped), and a confirmed clear of the failed ones."""
from __future__ import annotations

import os

import pytest
from django.contrib.auth.models import Permission, User
from rq import Queue

from orchestrator.engine import reporting
from orchestrator.engine.runs import create_manual_run
from orchestrator.models import AuditLog, TaskInstance
from orchestrator.redis_conn import get_redis
from retries.context import ExecutionContext
from retries.states import Reason, Source
from tests.api.personas import PASSWORD
from tests.browser.conftest import browser_page, own_connections  # noqa: F401
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

XSS = "<script>window.__pwned = true</script>"
WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)
SHOTS = os.environ.get("SCREENSHOT_DIR")


def _finish(ti: TaskInstance, *, fail: bool) -> None:
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER) and reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
    if fail:
        context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="ValueError", message="bad row")
        assert reporting.report_failure(ti.pk, ti.attempt_token, context, fingerprint="0123456789ab")
    else:
        result = {"path": f"s3://landing/part-{ti.map_index:03d}.csv", "rows": 100 + ti.map_index, "note": XSS}
        assert reporting.report_success(ti.pk, ti.attempt_token, result=result)


def _shot(page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, name), full_page=True)


def test_an_operator_reads_a_mapped_task_and_clears_its_failed_instance(live_server, browser_page):  # noqa: F811
    with own_connections():
        Queue("default", connection=get_redis()).empty()
        alice = User.objects.create_user("alice", password=PASSWORD)
        alice.user_permissions.add(Permission.objects.get(codename="change_taskinstance", content_type__app_label="orchestrator"))
        dag = DagFactory(dag_id="files", default_args={"retries": 0})
        TaskFactory(dag=dag, task_id="load_file", expand={"path": [f"part-{i}" for i in range(6)]})
        run = create_manual_run(dag)
        for ti in TaskInstance.objects.filter(dag_run=run).order_by("map_index"):
            if ti.map_index < 5:
                _finish(ti, fail=ti.map_index == 2)
        page = browser_page
        page.goto(f"{live_server.url}/dags/files/")
        page.fill("#id_username", "alice")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/dags/files/")
        cell = page.locator("a.sq[title^='load_file:']")
        assert "failed" in cell.get_attribute("class") and cell.inner_text() == "6"
        assert cell.get_attribute("title") == "load_file: 6 instances: 1 failed, 1 queued, 4 success"
        _shot(page, "mapped-grid.png")

        cell.click()
        page.wait_for_selector("#instance-table")
        assert page.locator("#instance-table tbody tr").count() == 6
        _shot(page, "mapped-task.png")
        page.click("#instances a:has-text('failed')")
        page.wait_for_selector("#instance-table tbody tr[data-map-index='2']")
        assert page.locator("#instance-table tbody tr").count() == 1

        page.click("#instance-table a:has-text('2')")
        page.wait_for_selector("#all-instances")
        assert page.text_content("h1").strip() == "load_file[2]"
        page.goto(page.url.replace("map_index=2", "map_index=0"))
        assert XSS in page.text_content("#result pre")
        assert page.evaluate("window.__pwned") is None
        _shot(page, "mapped-instance.png")

        page.click("#all-instances")
        page.wait_for_selector("#instance-table")
        page.click("#confirm-clear-failed summary")
        page.check("#confirm-clear-failed input[name=confirmed]")
        with page.expect_response(lambda r: r.url.endswith("/tasks/load_file/clear")) as response:
            page.click("#confirm-clear-failed button[type=submit]")
        assert response.value.status == 200
        page.wait_for_selector("#instance-table tr[data-map-index='2'] .state:not(.state-failed)")
        assert [e.details["map_index"] for e in AuditLog.objects.filter(action="clear")] == [2]
        assert TaskInstance.objects.get(dag_run=run, map_index=2).state in ("none", "scheduled", "queued")
