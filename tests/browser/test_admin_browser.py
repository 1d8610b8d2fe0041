"""The DAG admin page in headless Chromium: the task inline fits a 1,440 px screen, and a
validation error in it is on screen, not past the right edge. The screenshot is saved with
UPDATE_SCREENSHOTS=1, like the console's."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from orchestrator.models import Dag
from tests.api.factories import DagFactory, TaskFactory
from tests.api.personas import PASSWORD
from tests.browser.conftest import own_connections

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WIDTH, HEIGHT = 1440, 900
TASKS = 40


def many_tasks() -> Dag:
    """A chain of 40 tasks with long ids and callables, the widest text the inline's columns get."""
    dag = DagFactory(dag_id="warehouse_nightly_settlement")
    previous: list[str] = []
    for i in range(TASKS):
        task_id = f"load_customer_ledger_partition_{i:02d}"
        TaskFactory(dag=dag, task_id=task_id, python_callable="tests.api.factories.noop", upstream=previous, position=i)
        previous = [task_id]
    return dag


def log_in(page, base: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_load_state()


@pytest.mark.parametrize(
    ("row", "upstream", "shown"),
    [
        (TASKS - 1, "load_customer_ledger_partition_38, no_such_task", "unknown task 'no_such_task'"),
        (0, f"load_customer_ledger_partition_{TASKS - 1:02d}", "cycle: "),
    ],
    ids=["unknown_upstream", "cycle"],
)
def test_the_task_inline_fits_the_viewport_with_its_error_on_screen(live_server, browser_page, row, upstream, shown):
    with own_connections():
        User.objects.create_superuser("root", "root@example.com", PASSWORD)
        dag = many_tasks()
        page = browser_page
        page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
        log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/orchestrator/dag/{dag.pk}/change/")
        page.fill(f"#id_tasks-{row}-upstream", upstream)
        page.click("input[name=_save]")
        page.wait_for_load_state()

        error = page.locator(".inline-group td ul.errorlist", has_text=shown).first
        error.scroll_into_view_if_needed()
        assert error.is_visible()
        box = error.bounding_box()
        assert box is not None, f"the error is at {box}"
        assert box["x"] >= 0, f"the error is at {box}"
        assert box["x"] + box["width"] <= WIDTH, f"the error is at {box}"
        assert box["y"] >= 0, f"the error is at {box}"
        assert box["y"] + box["height"] <= HEIGHT, f"the error is at {box}"
        assert page.evaluate("document.scrollingElement.scrollWidth") <= WIDTH
        # Nor hidden in the inline's own horizontal scroll.
        assert page.evaluate("(() => { const t = document.querySelector('.inline-group .tabular'); return t.scrollWidth - t.clientWidth; })()") <= 0
        # Every value is whole in its box: the ids, callables, upstreams and trigger rules.
        cut = page.evaluate("""() => [...document.querySelectorAll(
            '.inline-group .tabular tr.form-row:not(.empty-form) td.field-task_id input, ' +
            '.inline-group .tabular tr.form-row:not(.empty-form) td.field-python_callable input, ' +
            '.inline-group .tabular tr.form-row:not(.empty-form) td.field-upstream input:not([aria-invalid]), ' +
            '.inline-group .tabular tr.form-row:not(.empty-form) td.field-trigger_rule select')]
            .filter(e => e.value && e.scrollWidth > e.clientWidth + 1).map(e => e.name + '=' + e.value)""")
        if row == TASKS - 1:  # the cycle's error names all forty tasks: it scrolls in its box
            assert cut == [], f"values cut off: {cut[:5]}"
        if row == TASKS - 1:
            selects = page.evaluate("""() => [...document.querySelectorAll('.inline-group td.field-trigger_rule select')]
                .filter(s => s.value && s.offsetParent !== null).map(s => { const c = document.createElement('canvas').getContext('2d');
                c.font = getComputedStyle(s).font; return c.measureText(s.options[s.selectedIndex].text).width + 24 <= s.clientWidth; })""")
            assert all(selects), "a trigger rule is cut off"
        assert Dag.objects.get(pk=dag.pk).tasks.get(position=row).upstream != [s.strip() for s in upstream.split(",")]  # nothing saved
        if os.environ.get("UPDATE_SCREENSHOTS") == "1" and row == TASKS - 1:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "admin-dag-inline-1440.png"))
