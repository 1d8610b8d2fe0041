"""Backfilling from the console in headless Chromium, with a real scheduler and worker: the form,
the dry run's preview before anything exists, the progress page and its buttons."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from deadlines.models import DeadlineDefinition
from orchestrator.models import Backfill, DagRun
from tests.api.factories import DagFactory, TaskFactory
from tests.browser.conftest import own_connections
from tests.browser.test_console_browser import login, operator, watched  # noqa: F401
from tests.conftest import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
FAST = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2"}


def fits(page, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{page.url} is {overflow}px wider than {width}px"
    page.set_viewport_size({"width": 1280, "height": 900})


def shot(page, name: str) -> None:
    if os.environ.get("UPDATE_SCREENSHOTS") != "1":  # like the other browser tests: docs change only when asked
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_an_operator_previews_creates_pauses_and_watches_a_backfill(live_server, watched, spawn):  # noqa: F811
    with own_connections():
        operator()
        queue = f"test-{uuid.uuid4().hex[:8]}"
        dag = DagFactory(
            dag_id="settlement", schedule="0 2 * * *", timezone="Europe/Amsterdam", paused=True,
            default_args={"queue": queue, "retries": 3, "execution_timeout": 60, "retry_delay": 30, "retry_max_delay": 120},
        )  # fmt: skip
        TaskFactory(dag=dag, task_id="extract", bash_command="sleep 1")
        TaskFactory(dag=dag, task_id="load", bash_command="sleep 1", upstream=["extract"])
        DeadlineDefinition.objects.create(dag=dag, reference="dagrun_queued_at", interval=400, callback="notifier:log")
        page = watched
        login(page, live_server.url, "/dags/settlement/")
        page.set_viewport_size({"width": 1280, "height": 900})

        # The form, then the preview: nothing is created yet.
        page.fill("#backfill input[name=from]", "2026-03-26")
        page.fill("#backfill input[name=to]", "2026-04-01T23:00")
        page.fill("#backfill input[name=max_active_runs]", "2")
        page.click("#backfill button[type=submit]")
        page.wait_for_selector("#backfill-preview")
        assert page.locator("#backfill-preview tr[data-action=create]").count() == 7
        assert not Backfill.objects.exists()
        fits(page, 390)
        shot(page, "backfill-preview")

        # Confirm: the backfill page, its runs started by a real scheduler and run by a worker.
        page.click("#create-backfill")
        page.wait_for_selector("#backfill-body")
        backfill = Backfill.objects.get()
        spawn("run_worker", queue)
        spawn("run_scheduler", env=FAST)
        wait_until(lambda: DagRun.objects.filter(backfill=backfill, state="success").exists(), timeout=90, message="a first run to finish")
        page.click("#backfill-pause")
        page.wait_for_selector("#backfill-unpause")
        assert page.locator("#backfill-state").inner_text() == "paused"
        page.reload()
        fits(page, 390)
        shot(page, "backfill-progress")
        page.click("#backfill-unpause")
        # The page follows the backfill to its end by itself (htmx poll).
        page.wait_for_function("document.querySelector('#backfill-state').innerText === 'success'", timeout=180_000)
        assert page.locator("#backfill-counts").inner_text().startswith("7 success")
        shot(page, "backfill-done")
        page.emulate_media(color_scheme="dark")
        shot(page, "backfill-done-dark")
        page.emulate_media(color_scheme="light")

        # The DAG stays paused; its grid marks the backfill's runs; the budget verdict is shown.
        page.goto(f"{live_server.url}/dags/settlement/")
        assert page.locator(".dag-grid .sq.backfill").count() == 7
        assert page.locator("#retry-budget tr.misses").count() == 2
        fits(page, 390)
        shot(page, "dag-backfills-and-budget")
        dag.refresh_from_db()
        assert dag.paused
