"""GET /api/v1/dags and /api/v1/dags/DAG_ID"""
from __future__ import annotations

import pytest

from tests.api.factories import DagFactory, chain_dag, make_run

pytestmark = pytest.mark.django_db


def test_it_lists_dags_with_their_last_run(bob_client):
    """Every DAG, sorted by id, with its tasks and the summary of its newest run."""
    etl = chain_dag("etl")
    DagFactory(dag_id="alpha", schedule="@daily", paused=True)
    make_run(etl)
    newest = make_run(etl)

    dags = bob_client.get("/api/v1/dags").json()["dags"]

    assert [d["dag_id"] for d in dags] == ["alpha", "etl"]
    alpha, etl_doc = dags
    assert (alpha["schedule"], alpha["paused"], alpha["last_run"]) == ("@daily", True, None)
    assert [t["task_id"] for t in etl_doc["tasks"]] == ["extract", "transform", "load"]
    assert etl_doc["tasks"][1]["upstream"] == ["extract"]
    assert etl_doc["last_run"]["run_id"] == newest.run_id


def test_it_shows_one_dag(bob_client):
    """One DAG's document."""
    chain_dag("etl")
    doc = bob_client.get("/api/v1/dags/etl").json()
    assert doc["dag_id"] == "etl"
    assert doc["timezone"] == "UTC"


def test_it_answers_404_json_for_an_unknown_dag(bob_client):
    """An unknown DAG is a JSON 404 naming it."""
    response = bob_client.get("/api/v1/dags/nope")
    assert response.status_code == 404
    assert response.json() == {"error": "unknown DAG 'nope'"}
