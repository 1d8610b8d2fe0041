"""An operator reads a mapped task in a real browser: the grid's one cell, the instances listed
and filtered, one instance's result (escaped), and a confirmed clear of the failed ones."""
from __future__ import annotations

import os

import pytest
from django.contrib.auth.models import Permission, User
from rq import Queue

from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import AuditLog, TaskInstance
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
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
    assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
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
        assert "failed" in cell.get_attribute("class")
        assert cell.inner_text() == "6"
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


SCREENSHOTS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "screenshots")


def test_a_wide_dag_and_a_big_mapped_task_page_fit_the_viewport(live_server, browser_page):  # noqa: F811
    """A DAG of 150 tasks, one mapped over 450 items: the grid shows a page of tasks, the mapped
    task's page the counts and a page of instances, each with its pager, and neither is wider than
    the viewport at 1,280 px or at phone width. With UPDATE_SCREENSHOTS=1, screenshots of both
    (1,280 px light and dark, 390 px light and dark)."""
    from orchestrator.models import Task

    with own_connections():
        User.objects.create_user("alice", password=PASSWORD)
        dag = DagFactory(dag_id="wide", default_args={"retries": 0})
        TaskFactory(dag=dag, task_id="load_file", expand={"path": [f"part-{i}" for i in range(450)]}, position=0)
        Task.objects.bulk_create([Task(dag=dag, task_id=f"step_{i:03d}", bash_command="true", position=i + 1) for i in range(149)])
        run = create_manual_run(dag)
        instances = TaskInstance.objects.filter(dag_run=run, task_id="load_file")
        instances.filter(map_index__lt=300).update(state="success", try_number=1)
        instances.filter(map_index__in=[7, 123, 201]).update(state="failed", try_number=1)
        TaskInstance.objects.filter(dag_run=run, task_id__startswith="step_").update(state="success", try_number=1)
        page = browser_page
        page.goto(f"{live_server.url}/dags/wide/")
        page.fill("#id_username", "alice")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/dags/wide/")
        mapped_url = f"{live_server.url}/dags/wide/runs/{run.run_id}/tasks/load_file"
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            for width in (1280, 390):
                page.set_viewport_size({"width": width, "height": 900})
                for name, url in (("grid-paged", f"{live_server.url}/dags/wide/?grid_page=2"), ("mapped-paged", f"{mapped_url}?page=2")):
                    page.goto(url)
                    pager = "#grid-pager" if name == "grid-paged" else "#instance-pager"
                    assert page.locator(pager).is_visible()
                    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
                        suffix = "" if width == 1280 else "-390"
                        page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}-{scheme}{suffix}.png"))  # the top: pager, counts, first rows
                    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                    assert overflow <= 0, f"{url} is {overflow}px wider than {width}px"
        page.goto(f"{live_server.url}/dags/wide/")
        assert page.text_content("#grid-pager").split()[1] == "1–100"
        cell = page.locator("a.sq[title^='load_file:']")
        assert cell.get_attribute("title") == "load_file: 450 instances: 3 failed, 150 queued, 297 success"
        page.goto(f"{mapped_url}?state=failed")
        assert page.locator("#instance-table tbody tr").count() == 3
        assert not page.locator("#instance-pager").count()
