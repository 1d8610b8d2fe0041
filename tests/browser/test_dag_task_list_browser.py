"""The DAG page of a wide DAG, in headless Chromium: the task list shows a page of tasks with
its pager, the page fits a phone and a desktop in both themes, and "next" turns the list's page
without moving the grid's.

With UPDATE_SCREENSHOTS=1 the screenshots dag-task-list-*.png in docs/screenshots/ are written too.
"""
from __future__ import annotations

import pytest

from deadlines.models import DeadlineDefinition
from orchestrator.models import Task
from tests.api.factories import make_run
from tests.browser.conftest import own_connections
from tests.browser.test_console_browser import login, operator
from tests.browser.test_what_a_person_sees import SAVE, SCREENSHOTS, THEMES
from tests.engine.factories import DagFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP, PHONE = 1280, 390


def shoot_task_list(page, name: str) -> None:
    """The window scrolled to the task list: the whole page of a wide DAG is thousands of pixels."""
    if SAVE:
        page.locator("#task-list").scroll_into_view_if_needed()
        page.evaluate("document.querySelector('#task-list').scrollIntoView()")
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


@pytest.mark.timeout(300)
def test_a_wide_dags_task_list_is_paged_and_fits_phone_and_desktop(live_server, browser_page):
    with own_connections():
        operator()
        dag = DagFactory(dag_id="wide", default_args={"retries": 3, "execution_timeout": 60, "retry_delay": 30, "retry_max_delay": 120})
        Task.objects.bulk_create(
            [Task(dag=dag, task_id=f"load_partition_{i:03d}", bash_command=f"./load.sh --partition {i}", upstream=[f"load_partition_{i - 1:03d}"] if i else [], position=i)
             for i in range(250)]
        )
        DeadlineDefinition.objects.create(dag=dag, reference="dagrun_queued_at", interval=400, callback="notifier:log")
        make_run(dag)
    page = browser_page
    login(page, live_server.url, "/dags/wide/")
    for width in (DESKTOP, PHONE):
        page.set_viewport_size({"width": width, "height": 900})
        for theme in THEMES:
            page.emulate_media(color_scheme=theme)
            page.goto(f"{live_server.url}/dags/wide/?grid_page=2")
            assert page.locator("#task-list-pager").inner_text().startswith("Tasks 1–100 of 250")
            assert page.locator("#task-list tbody tr").count() == 100
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"the DAG page is {overflow}px wider than {width}px"
            shoot_task_list(page, f"dag-task-list-{theme}-{width}")
    page.click("#task-list-pager a[rel=next]")
    page.wait_for_load_state()
    assert page.locator("#task-list-pager").inner_text().startswith("Tasks 101–200 of 250")
    assert page.locator("#grid-pager").inner_text().startswith("Tasks 101–200 of 250")  # the grid stayed on its page 2
    assert page.locator("#task-list tbody tr").first.get_attribute("data-task") == "load_partition_100"
