"""The operator console in headless Chromium with a real scheduler and worker.

Every test fails on a JavaScript error or a browser dialog (alert, confirm): confirmation
happens on the page.
"""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from rq import Worker

from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import AuditLog, TaskInstance
from orchestrator.operations import actions
from orchestrator.worker.host.spool import SET_ASIDE_KEY
from tests.api.factories import DagFactory, TaskFactory, chain_dag, fail, fail_until_failed, instance, make_run
from tests.api.personas import PASSWORD
from tests.browser.conftest import own_connections
from tests.browser.story import settlement_story
from tests.conftest import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
FAST = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2"}


@pytest.fixture
def watched(browser_page):
    """The page, with every JavaScript error and dialog recorded; the test fails on any."""
    problems: list[str] = []
    browser_page.on("pageerror", lambda exc: problems.append(f"error: {exc}"))
    browser_page.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    yield browser_page
    assert problems == []


def operator(staff: bool = False) -> User:
    alice = User.objects.create_user("alice", password=PASSWORD, is_staff=staff)
    for codename in ("trigger_dagrun", "change_taskinstance", "change_dag"):
        alice.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="orchestrator"))
    return alice


def login(page, base: str, path: str = "/") -> None:
    page.goto(f"{base}{path}")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def test_an_operator_triggers_a_run_watches_the_grid_and_clears_a_failure(live_server, watched, spawn, tmp_path):
    with own_connections():
        operator()
        gate = tmp_path / "input-ready"
        dag = DagFactory(dag_id="shop", default_args={"retries": 0})
        TaskFactory(dag=dag, task_id="extract", python_callable="", bash_command="sleep 0.2", upstream=[])
        TaskFactory(
            dag=dag, task_id="load", python_callable="", upstream=["extract"],
            bash_command=f"test -f {gate} || {{ echo 'missing <b>input</b>' >&2; exit 3; }}",
        )
        spawn("run_scheduler", env=FAST)
        spawn("run_worker")
        page = watched
        login(page, live_server.url, "/dags/shop/")
        page.click("#trigger button[type=submit]")
        page.wait_for_url("**/dags/shop/runs/**")
        page.goto(f"{live_server.url}/dags/shop/")
        # the grid turns green (and red) without a reload: htmx polling
        page.wait_for_selector("tr[data-task-id=extract] a.sq.state-success", timeout=30_000)
        page.wait_for_selector("tr[data-task-id=load] a.sq.state-failed", timeout=30_000)
        page.wait_for_function("document.querySelector('#dag-grid').getAttribute('hx-trigger') === null", timeout=10_000)

        page.click("tr[data-task-id=load] a.sq")
        page.wait_for_selector("#ti-state:has-text('failed')")
        assert "missing <b>input</b>" in page.text_content(".attempt pre.log")
        page.click("#actions summary:has-text('Clear')")
        assert "runs again with 1 more try" in page.text_content("#actions details[open] .explain")
        page.fill("#actions details[open] input[name=note]", "input delivered")
        gate.write_text("ok")
        page.click("#actions details[open] button:has-text('Confirm clear')")
        page.wait_for_selector("#ti-state:has-text('success')", timeout=30_000)
        assert AuditLog.objects.get(action="clear").details["note"] == "input delivered"


def test_reclassify_reads_the_right_numbers(live_server, watched):
    with own_connections():
        operator()
        run = make_run(chain_dag("flaky", retries=1))
        fail_until_failed(run, "extract")
        page = watched
        login(page, live_server.url, f"/dags/flaky/runs/{run.run_id}/tasks/extract")
        assert page.text_content("#ti-tries") == "attempt 2 of 2"
        page.click("#actions summary:has-text('Reclassify')")
        page.fill("#actions details[open] input[name=note]", "node drained")
        page.click("#actions details[open] button:has-text('Confirm')")
        page.wait_for_selector("#ti-platform:has-text('1 of 5 used')")
        # the same try repeats: still attempt 2 of 2, not 3 of 2
        assert page.text_content("#ti-tries") == "attempt 2 of 2"
        assert instance(run, "extract").attempts.filter(kind="platform").count() == 1


def test_a_dead_letter_is_two_clicks_from_the_dag_list(live_server, watched):
    with own_connections():
        operator()
        run = make_run(chain_dag("poison", retries=9, poison_threshold=2))
        fail(run, "extract")
        TaskInstance.objects.filter(task_id="extract").update(next_retry_at=timezone.now() - timedelta(seconds=1))
        fail(run, "extract")
        page = watched
        login(page, live_server.url)
        page.click("a:has-text('needs attention')")
        page.click("#task-extract td.task-id a")
        page.wait_for_selector("#ti-state:has-text('dead_letter')")


PAGES = {
    "dag-list": "/",
    "dag": "/dags/settlement/",
    "run": "/dags/settlement/runs/POISONED/",
    "task-instance": "/dags/settlement/runs/POISONED/tasks/load_ledger",
    "dead-letters": "/dead-letters/",
    "failures": "/failures/",
    "workers": "/workers/",
    "audit": "/audit/",
    "alerts": "/alerts/",
    "approvals": "/approvals/",
}


@pytest.fixture
def set_aside_report():
    """A report a worker set aside (the workers page lists it), removed after the test: Redis
    outlives it."""
    get_redis().lpush(SET_ASIDE_KEY, json.dumps({
        "worker_name": "reports-worker-1", "file": "/var/spool/orchestrator/set-aside/1842-7.json",
        "reason": "IntegrityError: insert or update on table \"orchestrator_taskattempt\" violates foreign key constraint",
        "task_instance_id": 1842, "token": 7, "at": time.time(),
    }))
    yield
    get_redis().delete(SET_ASIDE_KEY)


@pytest.mark.timeout(600)  # 32 page loads and screenshots on a shared machine
def test_pages_fit_the_viewport_and_screenshots(live_server, watched, spawn, set_aside_report):
    """Nothing wider than the viewport at 1,440 px and at phone width; with UPDATE_SCREENSHOTS=1
    the README's screenshots (1,440 px, light and dark) and the phone ones (390 px, light)."""
    with own_connections():
        alice = operator(staff=True)
        story = settlement_story()
        # The audit log's rows: a run triggered from the command line, a note on an action.
        actions.trigger(story.running.dag, None, triggered_by="cli", actor="ops")
        actions.mark_failed(instance(story.failed, "publish"), alice, note="publishing waits for the corrected file")
        # A live worker on a queue of its own (it takes none of the story's jobs).
        spawn("run_worker", "reports", "--name", "reports-worker-1")
        wait_until(lambda: any(w.name == "reports-worker-1" for w in Worker.all(connection=get_redis())), timeout=60, message="worker up")
        page = watched
        login(page, live_server.url)
        save = os.environ.get("UPDATE_SCREENSHOTS") == "1"
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            for width in (1440, 390):
                page.set_viewport_size({"width": width, "height": 900})
                for name, path in PAGES.items():
                    page.goto(f"{live_server.url}{path.replace('POISONED', story.poisoned.run_id)}")
                    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                    assert overflow <= 0, f"{path} is {overflow}px wider than {width}px"
                    if save and (width == 1440 or scheme == "light"):
                        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                        suffix = "" if width == 1440 else "-390"
                        page.screenshot(path=str(SCREENSHOTS / f"{name}-{scheme}{suffix}.png"), full_page=True)


def test_the_audit_logs_details_open_below_the_row_at_a_readable_width(live_server, watched):
    """Opened in its cell, a row's JSON got the Details column's width: one or two characters a
    line, a row hundreds of pixels tall. Opened, it takes the row below at the table's width."""
    with own_connections():
        alice = operator()
        run = make_run(chain_dag("ledger"))
        actions.mark_failed(instance(run, "extract"), alice, note="the supplier's file was rejected by the bank's validation service")
        AuditLog.objects.filter(action="mark_failed").update(details={
            "note": "the supplier's file was rejected by the bank's validation service",
            "rejected_file": "s3://landing/settlements/2026-11-28/supplier-statements-final-v2.csv",
            "checks": {"iban": "ok", "amounts": "mismatch in 3 of 1,204 lines", "currency": "EUR"},
        })
        page = watched
        login(page, live_server.url, "/audit/")
        for width in (1440, 390):
            page.set_viewport_size({"width": width, "height": 900})
            page.reload()
            assert not page.is_visible("tr.row-details pre")
            page.click("details.row-toggle summary")
            pre = page.wait_for_selector("tr.row-details pre", state="visible")
            box = pre.bounding_box()
            assert box is not None, (width, box)
            assert box["x"] >= 0, (width, box)
            assert box["x"] + box["width"] <= width, (width, box)
            assert box["width"] >= min(width - 80, 600), (width, box)
            # its text wraps inside it, and no cell of the page is narrower than a word in it
            assert page.evaluate("(el) => el.scrollWidth <= el.clientWidth", pre)
            narrow = page.evaluate(
                "() => [...document.querySelectorAll('#audit td')].filter(td => td.scrollWidth > td.clientWidth + 1).map(td => td.textContent.trim().slice(0, 40))"
            )
            assert narrow == [], (width, narrow)
            assert "mismatch in 3 of 1,204 lines" in pre.text_content()
            assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
