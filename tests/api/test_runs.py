"""GET /api/v1/dags/DAG_ID/runs and /api/v1/dags/DAG_ID/runs/RUN_ID"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import pytest

from orchestrator.models import DagRun
from tests.api.factories import chain_dag, fail, make_run, succeed

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)

# The run document, field by field.
RUN_FIELDS = {"dag_id", "run_id", "state", "queued_at", "start_date", "end_date", "logical_date", "task_instances", "deadlines"}
TASK_FIELDS = {
    "task_id", "state", "try_number", "max_tries", "infrastructure_try_number", "infrastructure_retry_limit",
    "next_retry_at", "failure_fingerprint", "last_failure_context", "attempts",
}
ATTEMPT_FIELDS = {"try_number", "infrastructure_try_number", "kind", "state", "start_date", "end_date", "context"}
CONTEXT_FIELDS = {"category", "reason", "source", "metadata"}


@pytest.fixture
def etl():
    return chain_dag("etl", retries=2)


def test_it_lists_runs_newest_first(bob_client, etl):
    """Runs come newest first, as summaries."""
    old, new = make_run(etl, at=T0), make_run(etl, at=T0 + timedelta(hours=1))
    runs = bob_client.get("/api/v1/dags/etl/runs").json()["runs"]
    assert [r["run_id"] for r in runs] == [new.run_id, old.run_id]
    assert runs[0]["state"] == "queued"
    assert "task_instances" not in runs[0]


def test_it_filters_runs_by_state_and_limits_them(bob_client, etl):
    """?state= keeps runs in that state; ?limit= caps how many come back."""
    for hour in range(3):
        make_run(etl, at=T0 + timedelta(hours=hour))
    done = make_run(etl, at=T0 + timedelta(hours=5))
    DagRun.objects.filter(pk=done.pk).update(state="success")

    assert [r["run_id"] for r in bob_client.get("/api/v1/dags/etl/runs?state=success").json()["runs"]] == [done.run_id]
    assert len(bob_client.get("/api/v1/dags/etl/runs?limit=2").json()["runs"]) == 2
    assert len(bob_client.get("/api/v1/dags/etl/runs?state=queued&limit=10").json()["runs"]) == 3


@pytest.mark.parametrize(
    ("query", "message"),
    [("state=bogus", "invalid state 'bogus'"), ("limit=0", "invalid limit '0'"), ("limit=ten", "invalid limit 'ten'")],
)
def test_it_refuses_bad_run_filters(bob_client, etl, query, message):
    """A bad ?state= or ?limit= is a 400 naming the parameter and its value."""
    response = bob_client.get(f"/api/v1/dags/etl/runs?{query}")
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_it_serves_the_documented_run_document(bob_client, etl):
    """The run document has the field names, down to attempts and contexts."""
    run = make_run(etl, at=T0)
    succeed(run, "extract")
    fail(run, "transform", stdout="working\n", stderr="Traceback ...\nValueError: bad row\n")

    doc = bob_client.get(f"/api/v1/dags/etl/runs/{quote(run.run_id, safe='')}").json()

    assert doc.keys() >= RUN_FIELDS
    assert (doc["dag_id"], doc["run_id"], doc["state"]) == ("etl", "manual__2026-11-21T10:00:00+00:00", "running")
    extract, transform, load = doc["task_instances"]
    for ti in (extract, transform, load):
        assert ti.keys() >= TASK_FIELDS
    assert (transform["state"], transform["try_number"], transform["max_tries"]) == ("up_for_retry", 1, 3)
    assert transform["failure_fingerprint"] == "4a7c1d9e02bb"
    assert CONTEXT_FIELDS | {"at"} <= transform["last_failure_context"].keys()
    assert transform["last_failure_context"]["category"] == "application"
    (attempt,) = transform["attempts"]
    assert ATTEMPT_FIELDS | {"fingerprint"} <= attempt.keys()
    assert (attempt["kind"], attempt["state"], attempt["fingerprint"]) == ("user", "failed", "4a7c1d9e02bb")
    assert attempt["context"].keys() >= CONTEXT_FIELDS
    (success,) = extract["attempts"]
    assert success["context"] is None
    assert "fingerprint" not in success
    assert load["attempts"] == []
    assert load["last_failure_context"] is None
    assert doc["deadlines"] == []


@pytest.mark.parametrize("encode", [True, False], ids=["percent-encoded", "raw"])
def test_it_finds_a_run_whose_id_holds_colons_and_plus(bob_client, etl, encode):
    """run_id with ':' and '+' works percent-encoded (%2B) and raw; '+' is never read as a space."""
    run = make_run(etl, at=T0)
    run_id = quote(run.run_id, safe="") if encode else run.run_id
    response = bob_client.get(f"/api/v1/dags/etl/runs/{run_id}")
    assert response.status_code == 200
    assert response.json()["run_id"] == "manual__2026-11-21T10:00:00+00:00"


def test_it_answers_404_json_for_an_unknown_run(bob_client, etl):
    """An unknown run (or a run of another DAG) is a JSON 404."""
    other = chain_dag("other")
    run = make_run(other, at=T0)
    response = bob_client.get(f"/api/v1/dags/etl/runs/{quote(run.run_id)}")
    assert response.status_code == 404
    assert "has no run" in response.json()["error"]
    assert bob_client.get("/api/v1/dags/nope/runs").status_code == 404
