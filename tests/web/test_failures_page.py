"""The failures page: a window, counts every way, a chart, the error on each row, filters."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from orchestrator.engine import failure_counts
from orchestrator.models import FailureCount, TaskAttempt, TaskInstance
from retries.states import Category, Reason
from tests.api.factories import chain_dag, fail, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def failures():
    run = make_run(chain_dag("etl", retries=5))
    fail(run, "extract", message="bad row 7")
    fail(run, "extract", message="bad row 7")
    fail(run, "extract", Reason.WORKER_LOST, fingerprint=None)
    other = make_run(chain_dag("ops", retries=5))
    fail(other, "extract", Reason.EXECUTION_TIMEOUT, fingerprint=None)


def count_cell(html: str, name: str) -> int:
    match = re.search(rf">{name}(?:</span>)?</a></td><td class=\"num\">(\d+)</td>", html)
    assert match, f"no count for {name}"
    return int(match.group(1))


def test_it_counts_failures_every_way(bob_client, failures):
    """Counts by category, reason, DAG, task, host and fingerprint; one row per failed attempt."""
    html = bob_client.get("/failures/").content.decode()
    assert count_cell(html, "application") == 2
    assert count_cell(html, "infrastructure") == 1
    assert count_cell(html, "task_exception") == 2
    assert count_cell(html, "execution_timeout") == 1
    assert count_cell(html, "etl") == 3
    assert count_cell(html, "ops") == 1
    assert count_cell(html, "4a7c1d9e02bb") == 2
    assert "By worker host" in html
    assert "By task" in html
    assert "(4 of 4, newest first)" in html
    assert "ValueError: bad row 7" in html  # the error on the row
    # the chart: 25 hourly bars (empty ones too), the latest stacked by category, a labelled axis
    assert '<svg class="chart stacked"' in html
    assert html.count('<g class="bucket"') == 25
    assert re.search(r"<title>\d\d \d\d:00: 4 \(1 infrastructure, 2 application, 1 timeout\)</title>", html)
    assert html.count('<text x=') >= 4
    assert 'href="/dags/etl/runs/' in html
    assert "/tasks/extract" in html


def test_it_filters_and_keeps_the_filter_selected(bob_client, failures):
    html = bob_client.get("/failures/?category=application&dag_id=etl").content.decode()
    assert "(2 of 2, newest first)" in html
    assert '<option value="application" selected>' in html
    assert "(1 of 1" in bob_client.get("/failures/?reason=worker_lost").content.decode()
    assert "(1 of 1" in bob_client.get("/failures/?dag_id=ops").content.decode()
    assert "(2 of 2" in bob_client.get("/failures/?fingerprint=4a7c1d9e02bb").content.decode()
    assert "(4 of 4" in bob_client.get("/failures/?host=test-host").content.decode()


def test_the_window_leaves_older_failures_out(bob_client, failures):
    TaskAttempt.objects.filter(context__reason="execution_timeout").update(end_date=timezone.now() - timedelta(days=2))
    FailureCount.objects.all().delete()  # an end date moved by hand: count the attempts again
    failure_counts.backfill()
    assert "(3 of 3" in bob_client.get("/failures/?window=24h").content.decode()
    assert "(4 of 4" in bob_client.get("/failures/?window=7d").content.decode()


def test_reason_poisoned_finds_dead_lettered_tasks(bob_client):
    """The attempt keeps task_exception; the dead-lettered task reads poisoned: either matches."""
    run = make_run(chain_dag("etl", retries=9, poison_threshold=2))
    fail(run, "extract")
    TaskInstance.objects.filter(task_id="extract").update(next_retry_at=timezone.now() - timedelta(seconds=1))
    assert fail(run, "extract").state == "dead_letter"
    html = bob_client.get("/failures/?reason=poisoned").content.decode()
    assert "(2 of 2" in html
    assert ">poisoned</span>" in html


@pytest.mark.parametrize("query", ["window=2y", "reason=nope", "category=%00"])
def test_it_explains_a_bad_filter(bob_client, query):
    response = bob_client.get(f"/failures/?{query}")
    assert response.status_code == 400
    assert 'class="error"' in response.content.decode()


def test_it_escapes_error_text(bob_client):
    run = make_run(chain_dag("etl", retries=0))
    fail(run, "extract", message="<script>alert(1)</script>")
    html = bob_client.get("/failures/").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_its_query_count_does_not_grow_with_history(bob_client, django_assert_max_num_queries):
    run = make_run(chain_dag("etl", retries=30))
    for _ in range(12):
        fail(run, "extract")
    with django_assert_max_num_queries(14):
        assert bob_client.get("/failures/").status_code == 200


def test_the_page_and_the_api_find_the_same_failures(bob_client):
    """One filter for both: every reason and category counts the same on the page and in the
    API, `poisoned` (the dead-lettered task's, not its attempts') included."""
    run = make_run(chain_dag("etl", retries=9, poison_threshold=2))
    fail(run, "extract")
    TaskInstance.objects.filter(task_id="extract").update(next_retry_at=timezone.now() - timedelta(seconds=1))
    assert fail(run, "extract").state == "dead_letter"
    other = make_run(chain_dag("ops", retries=5))
    fail(other, "extract", Reason.WORKER_LOST, fingerprint=None)
    fail(other, "extract", Reason.EXECUTION_TIMEOUT, fingerprint=None)
    filters = [{"reason": r.value} for r in Reason] + [{"category": c.value} for c in Category] + [{"dag_id": "ops"}, {}]
    for params in filters:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        html = bob_client.get(f"/failures/?{query}").content.decode()
        shown = re.search(r"\((\d+) of (\d+), newest first\)", html)
        on_page = int(shown.group(2)) if shown else 0
        assert bob_client.get(f"/api/v1/failures?{query}").json()["count"] == on_page, params
    assert bob_client.get("/api/v1/failures?reason=poisoned").json()["count"] == 2
