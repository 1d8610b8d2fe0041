"""Every console page with what tasks write at their worst: `<script>` in output, exception
messages and set-aside file names, unbroken strings hundreds of characters long, ids at their
longest, a mapped task of 1,000 instances, a paged grid. Nothing a task wrote runs or renders as
HTML, and no page is wider than the viewport, at desktop and phone width, in both themes.

With LOOK_DIR=<dir> every page is photographed there, for a person to look at."""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from orchestrator.foundation.outputstore import output_store
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import Task, TaskInstance
from orchestrator.operations import actions, backfills
from orchestrator.worker.host.spool import SET_ASIDE_KEY
from tests.api.factories import DagFactory, TaskFactory, fail, instance, make_run, succeed
from tests.browser.conftest import own_connections
from tests.browser.test_console_browser import login, operator

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCRIPT = "<script>window.__pwned = true</script>"
IMAGE = '<img src=x onerror="window.__pwned = true">'
UNBROKEN = "x" * 400
DAG_ID = "nightly_settlement_reconciliation_for_the_european_clearing_house_and_its_partner_banks_v2"
TASK_ID = "load_the_ledger_from_the_partner_bank_export_and_reconcile_it_against_the_clearing_file"
PATH = "/srv/settlement/" + "/".join(["a_rather_deep_directory_name"] * 8) + "/load.py"
TRACEBACK = "Traceback (most recent call last):\n" + "".join(
    f'  File "{PATH}", line {40 + i}, in step_{i}\n    value = step_{i + 1}(value)  # {SCRIPT}\n' for i in range(30)
) + f"ValueError: {SCRIPT} {UNBROKEN}\n"
LOOK = os.environ.get("LOOK_DIR")


def _story() -> dict[str, str]:
    """The data; the pages to look at, by name."""
    alice = operator(staff=True)
    dag = DagFactory(dag_id=DAG_ID, description=f"Settles the day. {SCRIPT} {UNBROKEN}", default_args={"retries": 1, "retry_delay": 0.1, "retry_jitter": "none", "poison_threshold": 2})
    TaskFactory(dag=dag, task_id="extract", upstream=[], position=0)
    TaskFactory(dag=dag, task_id=TASK_ID, upstream=["extract"], position=1, python_callable="", bash_command=f"python {PATH} --note '{SCRIPT}'")
    TaskFactory(dag=dag, task_id="poisoned", upstream=["extract"], position=2)
    TaskFactory(dag=dag, task_id="load_file", upstream=[], position=3, expand={"path": [f"part-{i}" for i in range(1000)]})
    Task.objects.bulk_create([Task(dag=dag, task_id=f"step_{i:03d}", bash_command="true", position=4 + i) for i in range(146)])
    now = timezone.now()
    old = make_run(dag, at=now - timedelta(hours=2))
    succeed(old, "extract")
    run = make_run(dag, at=now - timedelta(hours=1))
    succeed(run, "extract")
    for _ in range(2):
        ti = fail(run, TASK_ID, stdout=f"reading {PATH}\n{SCRIPT}\n{UNBROKEN}\n", stderr=TRACEBACK, exception_type="ValueError", message=f"{SCRIPT} {UNBROKEN}")
        TaskInstance.objects.filter(pk=ti.pk).update(next_retry_at=now - timedelta(seconds=1))
    for _ in range(2):
        ti = fail(run, "poisoned", fingerprint="9c41e07bd2aa", stderr=TRACEBACK, exception_type="FileNotFoundError", message=f"{IMAGE} {UNBROKEN}")
        TaskInstance.objects.filter(pk=ti.pk).update(next_retry_at=now - timedelta(seconds=1))
    actions.mark_failed(instance(old, "extract"), alice, note=f"{SCRIPT} {UNBROKEN}")
    # The output store has the first attempt's full output and not the second's.
    store = output_store()
    failed = instance(run, TASK_ID)
    first = failed.attempts.order_by("pk").first()
    for stream, text in (("stdout", f"reading {PATH}\n{SCRIPT}\n" * 2000), ("stderr", TRACEBACK * 50)):
        path = store.path((failed.pk, first.attempt_token), stream)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # A mapped task of 1,000 instances in every state.
    mapped = TaskInstance.objects.filter(dag_run=old, task_id="load_file")  # the first run expands it
    start = 0
    for state, below in (("success", 600), ("failed", 650), ("up_for_retry", 700), ("running", 760), ("queued", 800), ("dead_letter", 810), ("upstream_failed", 830), ("skipped", 850), ("none", 1000)):
        mapped.filter(map_index__gte=start, map_index__lt=below).update(state=state, try_number=1 if state != "none" else 0)
        start = below
    TaskInstance.objects.filter(dag_run=run, task_id__startswith="step_").update(state="success", try_number=1)
    get_redis().lpush(SET_ASIDE_KEY, json.dumps({  # removed by `set_aside_entry`
        "worker_name": f"worker-{UNBROKEN}", "file": f"{PATH}/{SCRIPT}.json", "reason": f"{SCRIPT} the database refused it: {UNBROKEN}",
        "task_instance_id": failed.pk, "token": first.attempt_token, "at": time.time(),
    }))
    dag.schedule, dag.start_date = "@daily", now - timedelta(days=30)
    dag.save()
    backfill = backfills.create(backfills.check(dag, start=(now - timedelta(days=5)).date().isoformat(), end=(now - timedelta(days=3)).date().isoformat()), alice)
    base = f"/dags/{DAG_ID}/runs/{run.run_id}"
    mapped_base = f"/dags/{DAG_ID}/runs/{old.run_id}"
    return {
        "dag-list": "/",
        "dag": f"/dags/{DAG_ID}/",
        "grid-page-2": f"/dags/{DAG_ID}/?grid_page=2",
        "run": f"{base}/",
        "task-full-output": f"{base}/tasks/{TASK_ID}",
        "task-poisoned": f"{base}/tasks/poisoned",
        "mapped": f"{mapped_base}/tasks/load_file",
        "mapped-page-3": f"{mapped_base}/tasks/load_file?page=3",
        "mapped-instance": f"{mapped_base}/tasks/load_file?map_index=620",
        "dead-letters": "/dead-letters/",
        "failures": "/failures/",
        "fingerprint": "/fingerprints/9c41e07bd2aa/",
        "workers": "/workers/",
        "audit": "/audit/",
        "backfill": f"/backfills/{backfill.pk}/",
    }


@pytest.fixture
def set_aside_entry():
    """The workers page reads set-aside reports from Redis, which outlives the test: the
    report this test sets aside is removed after it."""
    yield
    get_redis().delete(SET_ASIDE_KEY)


@pytest.mark.timeout(900)  # 64 page loads on a shared machine
def test_what_tasks_wrote_stays_text_and_every_page_fits(live_server, browser_page, settings, tmp_path, set_aside_entry):
    settings.ORCHESTRATOR_TASK_OUTPUT_DIR = str(tmp_path / "outputs")
    with own_connections():
        pages = _story()
        page = browser_page
        page.set_default_navigation_timeout(30_000)  # a shared machine; the pages' speed is measured elsewhere
        errors: list[str] = []
        too_wide: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        login(page, live_server.url, pages["dag"])
        # 1,000 instances: a count the 14 px square holds; the title has the exact counts
        cell = page.locator("a.sq[title^='load_file:']").first
        assert cell.inner_text() == "1k"
        assert cell.get_attribute("title").startswith("load_file: 1000 instances: ")
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            for width in (1280, 390):
                page.set_viewport_size({"width": width, "height": 900})
                for name, path in pages.items():
                    response = page.goto(f"{live_server.url}{path}")
                    assert response is not None, f"{path}: {response and response.status}"
                    assert response.status == 200, f"{path}: {response and response.status}"
                    assert page.evaluate("window.__pwned") is None, f"{path} ran what a task wrote"
                    assert page.locator("main script, main img[src=x]").count() == 0, f"{path} rendered task text as HTML"
                    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                    if LOOK:
                        Path(LOOK).mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=f"{LOOK}/{name}-{scheme}-{width}.png", full_page=True)
                    if overflow > 0:
                        too_wide.append(f"{name} is {overflow}px wider than {width}px ({scheme})")
        assert errors == []
        assert too_wide == []
