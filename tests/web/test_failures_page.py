"""The failures page: filters and counts by category and reason."""
from __future__ import annotations

import re

import pytest

from retries.states import Reason
from tests.api.factories import chain_dag, fail, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def failures():
    run = make_run(chain_dag("etl", retries=5))
    fail(run, "extract")
    fail(run, "extract")
    fail(run, "extract", Reason.WORKER_LOST, fingerprint=None)
    other = make_run(chain_dag("ops", retries=5))
    fail(other, "extract", Reason.EXECUTION_TIMEOUT, fingerprint=None)


def count_cell(html: str, name: str) -> int:
    match = re.search(rf">{name}(?:</span>)?</td><td class=\"num\">(\d+)</td>", html)
    assert match, f"no count for {name}"
    return int(match.group(1))


def test_it_counts_failures_by_category_and_reason(bob_client, failures):
    """Counts by category and by reason, and one row per failed attempt."""
    html = bob_client.get("/failures/").content.decode()
    assert count_cell(html, "application") == 2
    assert count_cell(html, "infrastructure") == 1
    assert count_cell(html, "task_exception") == 2
    assert count_cell(html, "execution_timeout") == 1
    assert "(4 of 4, newest first)" in html


def test_it_filters_by_category_reason_and_dag(bob_client, failures):
    """The filters narrow both the rows and the counts, and stay selected in the form."""
    html = bob_client.get("/failures/?category=application&dag_id=etl").content.decode()
    assert "(2 of 2, newest first)" in html
    assert '<option value="application" selected>' in html
    assert "execution_timeout</td>" not in html
    assert "(1 of 1" in bob_client.get("/failures/?reason=worker_lost").content.decode()
    assert "(1 of 1" in bob_client.get("/failures/?dag_id=ops").content.decode()


def test_it_explains_a_bad_filter(bob_client):
    """A bad filter value is a 400 page naming it (escaped)."""
    response = bob_client.get("/failures/?since=<b>soon</b>")
    assert response.status_code == 400
    assert "invalid since &#x27;&lt;b&gt;soon&lt;/b&gt;&#x27;" in response.content.decode()
