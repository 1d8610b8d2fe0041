"""An operator logs in, reads a failed task's output and clears it, in a real browser."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from orchestrator.models import AuditLog, DagRun
from tests.api.factories import chain_dag, fail_until_failed, instance, make_run
from tests.api.personas import PASSWORD
from tests.browser.conftest import own_connections

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

XSS = "<script>window.__pwned = true</script><img src=x onerror=\"window.__pwned = true\">"


def test_it_lets_an_operator_clear_a_failed_task(live_server, browser_page):
    """Login; escaped output that never runs; Clear swaps in the new state; polling ends with the run."""
    with own_connections():
        alice = User.objects.create_user("alice", password=PASSWORD)
        alice.user_permissions.add(Permission.objects.get(codename="change_taskinstance", content_type__app_label="orchestrator"))
        run = make_run(chain_dag("etl", retries=0))
        fail_until_failed(run, "extract", stderr=f"ValueError: {XSS}\n")
        page = browser_page

        page.goto(f"{live_server.url}/dags/etl/runs/{run.run_id}/")
        assert "/accounts/login/" in page.url
        page.fill("#id_username", "alice")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/dags/etl/runs/**")

        assert page.text_content("#run-state") == "failed"
        page.click("#task-extract details[id^=attempts] summary")
        assert XSS in page.text_content("#task-extract pre.log")
        assert page.evaluate("window.__pwned") is None

        with page.expect_response(lambda r: r.url.endswith("/tasks/extract/clear")) as response:
            page.click("#task-extract summary:has-text('Clear')")
            page.click("#task-extract button:has-text('Confirm clear')")
        assert response.value.status == 200
        page.wait_for_selector("#run-state:has-text('running')")
        assert page.get_attribute("#run-body", "hx-trigger").startswith("every 2s")
        # The attempts the operator opened stay open across the swap.
        assert page.eval_on_selector("#task-extract details[id^=attempts]", "d => d.open")
        assert instance(run, "extract").state in ("none", "scheduled", "queued")
        assert AuditLog.objects.get().username == "alice"
        assert page.evaluate("window.__pwned") is None

        # The page polls while the run is unfinished and stops once a poll sees it ended.
        DagRun.objects.filter(pk=run.pk).update(state="success")
        page.wait_for_selector("#run-state:has-text('success')")
        assert page.get_attribute("#run-body", "hx-trigger") is None
