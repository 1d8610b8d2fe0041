"""The API answers with the documents as `orchestrator.operations.documents` builds them (the CLI prints the
same dicts): ninja checks each against its model and sends it byte for byte as Django's
JsonResponse would, keys in the builder's order, a key the builder leaves out left out."""
from __future__ import annotations

import json

import pytest
from django.core.serializers.json import DjangoJSONEncoder

from orchestrator.api.queries import FailureFilter, failed_attempts, failure_document
from orchestrator.models import TaskAttempt
from orchestrator.operations.documents import run_document
from tests.api.factories import chain_dag, fail, make_run, succeed

pytestmark = pytest.mark.django_db


def as_json_response(document: dict) -> bytes:
    return json.dumps(document, cls=DjangoJSONEncoder).encode()


@pytest.fixture
def failed_run():
    run = make_run(chain_dag("etl"))
    succeed(run, "extract")
    fail(run, "transform", stderr="ValueError: bad row \ufffd\n")
    run.refresh_from_db()
    return run


def test_a_run_is_answered_as_built(bob_client, failed_run):
    attempts = TaskAttempt.objects.filter(task_instance__dag_run=failed_run)
    assert {bool(a.fingerprint) for a in attempts} == {True, False}  # with and without the optional key
    response = bob_client.get(f"/api/v1/dags/etl/runs/{failed_run.run_id}")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.content == as_json_response(run_document(failed_run))


def test_failures_are_answered_as_built(bob_client, failed_run):
    response = bob_client.get("/api/v1/failures")
    rows = failed_attempts(FailureFilter())
    assert response.content == as_json_response({"count": 1, "failures": [failure_document(a) for a in rows]})


def test_any_json_a_task_returned_is_answered_as_it_is(bob_client, failed_run):
    """A result is any JSON, however deep: stored, it is answered, not refused by its model."""
    deep: list = []
    for _ in range(200):
        deep = [deep, {"k": "\ufffd"}]
    TaskAttempt.objects.filter(task_instance__dag_run=failed_run).update(result=deep)
    response = bob_client.get(f"/api/v1/dags/etl/runs/{failed_run.run_id}")
    assert response.status_code == 200
    assert response.content == as_json_response(run_document(failed_run))
