"""The task page of a resumable task in headless Chromium: its task state (a long value folded),
the attempts' decisions, and the clear dialog's "keep the task state"."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine import task_state_store
from orchestrator.engine.reporting import report_failure, report_success
from orchestrator.models import TaskStateEntry
from retries.context import ExecutionContext
from retries.states import Reason, Source, TaskState
from tests.api.factories import chain_dag, instance, make_run, start
from tests.browser.conftest import own_connections
from tests.browser.test_console_browser import login, operator

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def test_an_operator_reads_the_task_state_and_clears_keeping_it(live_server, browser_page):
    page = browser_page
    with own_connections():
        operator()
        run = make_run(chain_dag("warehouse", task_ids=("export", "load"), retries=1))
        ti = start(run, "export")
        task_state_store.apply(ti.pk, ti.attempt_token, [
            {"op": "set", "key": "remote_job_id", "value": "b7c41e09a2f3"},
            {"op": "resume", "key": "", "value": "submitted"},
        ])
        lost = ExecutionContext.of(Reason.WORKER_LOST, Source.SCHEDULER)  # the worker died: platform retry
        assert report_failure(ti.pk, ti.attempt_token, lost, expected=(TaskState.RUNNING,))
        ti = start(run, "export")
        manifest = {"files": [f"s3://exports/2026-11-25/part-{n:04d}.parquet" for n in range(6)], "rows": 1_204_331}
        task_state_store.apply(ti.pk, ti.attempt_token, [
            {"op": "resume", "key": "", "value": "reattached"},
            {"op": "set", "key": "manifest", "value": manifest},
        ])
        assert report_success(ti.pk, ti.attempt_token)
        login(page, live_server.url, f"/dags/warehouse/runs/{run.run_id}/tasks/export")
        page.set_viewport_size({"width": 1280, "height": 1000})
        section = page.locator("#task-state")
        assert "2 keys" in section.text_content()
        assert page.locator(".badge.resume").all_text_contents() == ["submitted", "reattached"]
        page.click("#task-state details summary")  # the long manifest unfolds
        assert "part-0005.parquet" in page.text_content("#task-state details pre")
        assert section.locator("td a").first.text_content() == "attempt #2"
        SCREENSHOTS.mkdir(exist_ok=True)
        section.screenshot(path=str(SCREENSHOTS / "task-state-light.png"))
        page.click("#actions summary:has-text('Clear')")
        assert "task state is emptied" in page.text_content("#actions details[open] .explain")
        page.check("#actions details[open] input[name=keep_task_state]")
        page.click("#actions details[open] button:has-text('Confirm clear')")
        page.wait_for_selector("#ti-state:not(:has-text('success'))")
        assert set(TaskStateEntry.objects.filter(task_instance=instance(run, "export")).values_list("key", flat=True)) == {
            "remote_job_id", "manifest"
        }
