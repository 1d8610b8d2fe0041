"""GET /api/v1/failures?category=&reason=&dag_id=&since="""
from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from orchestrator.models import TaskAttempt
from retries.states import Reason
from tests.api.factories import chain_dag, fail, make_run, succeed

pytestmark = pytest.mark.django_db


@pytest.fixture
def failures():
    """etl: an application failure of extract, then a worker_lost of transform; ops: a timeout."""
    etl_run = make_run(chain_dag("etl", retries=3))
    fail(etl_run, "extract")
    TaskAttempt.objects.update(end_date=timezone.now() - timedelta(hours=2))
    fail(etl_run, "extract", Reason.WORKER_LOST, fingerprint=None)
    ops_run = make_run(chain_dag("ops", retries=3))
    succeed(ops_run, "extract")
    fail(ops_run, "transform", Reason.EXECUTION_TIMEOUT, fingerprint=None)


def get(client, **params):
    return client.get(f"/api/v1/failures?{urlencode(params)}")


def test_it_lists_failed_attempts_newest_first(bob_client, failures):
    """Every failed attempt, newest first, with where it happened and why."""
    body = get(bob_client).json()
    assert body["count"] == 3
    rows = body["failures"]
    assert [(r["dag_id"], r["task_id"], r["context"]["reason"]) for r in rows] == [
        ("ops", "transform", "execution_timeout"),
        ("etl", "extract", "worker_lost"),
        ("etl", "extract", "task_exception"),
    ]
    oldest = rows[-1]
    assert oldest.keys() >= {
        "dag_id", "run_id", "task_id", "try_number", "infrastructure_try_number", "kind", "context", "fingerprint", "end_date",
    }
    assert (oldest["try_number"], oldest["kind"], oldest["fingerprint"]) == (1, "user", "4a7c1d9e02bb")
    assert (rows[1]["kind"], rows[1]["infrastructure_try_number"]) == ("platform", 0)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"category": "infrastructure"}, ["worker_lost"]),
        ({"category": "application"}, ["task_exception"]),
        ({"reason": "execution_timeout"}, ["execution_timeout"]),
        ({"dag_id": "etl"}, ["worker_lost", "task_exception"]),
        ({"dag_id": "etl", "category": "timeout"}, []),
        ({"since": "SINCE"}, ["execution_timeout", "worker_lost"]),
        ({"limit": "1"}, ["execution_timeout"]),
    ],
)
def test_it_filters_failures(bob_client, failures, params, expected):
    """category, reason, dag_id, since and limit narrow the list."""
    if params.get("since") == "SINCE":
        params["since"] = (timezone.now() - timedelta(hours=1)).isoformat()
    rows = get(bob_client, **params).json()["failures"]
    assert [r["context"]["reason"] for r in rows] == expected


def test_it_reads_an_unescaped_plus_in_since(bob_client, failures):
    """since=...+00:00 sent without escaping the '+' (it arrives as a space) still parses."""
    since = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    response = bob_client.get(f"/api/v1/failures?since={since}")
    assert response.status_code == 200
    assert response.json()["count"] == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"category": "cosmic_rays"}, "invalid category 'cosmic_rays'"),
        ({"reason": "bad_luck"}, "invalid reason 'bad_luck'"),
        ({"since": "yesterday"}, "invalid since 'yesterday'"),
        ({"limit": "-1"}, "invalid limit '-1'"),
    ],
)
def test_it_refuses_bad_filters(bob_client, params, message):
    """A bad filter is a 400 naming the parameter and the value."""
    response = get(bob_client, **params)
    assert response.status_code == 400
    assert message in response.json()["error"]
