"""A manual run's logical date, through the CLI (`trigger_dag --logical-date`), the API
(`"logical_date"`) and the console's trigger form: naive in the DAG's timezone, used by its
`dagrun_logical_date` deadlines, never making two runs share an id; a value that is not ISO 8601
is refused by each, naming it, and nothing is created."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import pytest
from django.core.management import CommandError, call_command

from deadlines.models import DeadlineDefinition
from orchestrator.models import AuditLog, Dag, DagRun
from orchestrator.operations.documents import run_document
from tests.api.factories import chain_dag
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

# 02:00 in Amsterdam on 31 January is 01:00 UTC; the deadline is an hour of wall clock later.
NAIVE = "2026-01-31T02:00:00"
AT = "2026-01-31T01:00:00+00:00"
NEED_BY = "2026-01-31T02:00:00+00:00"
BAD = ["yesterday", "2026-02-30", "31/01/2026", "2026-01-31T25:00", "", "   "]


@pytest.fixture
def dag() -> Dag:
    """etl, in Amsterdam, with a deadline an hour after each run's logical date."""
    dag = chain_dag("etl")
    dag.timezone = "Europe/Amsterdam"
    dag.save()
    DeadlineDefinition.objects.create(dag=dag, reference="dagrun_logical_date", interval=3600, callback="notifier:log")
    return dag


def _deadline(document: dict) -> str:
    (deadline,) = document["deadlines"]
    assert deadline["reference"] == "dagrun_logical_date"
    return deadline["need_by"]


def _nothing_created() -> None:
    assert not DagRun.objects.exists()
    assert not AuditLog.objects.exists()


# --- the API ---------------------------------------------------------------------------------


def post(client, body) -> object:
    return client.post("/api/v1/dags/etl/runs", json.dumps(body), content_type="application/json")


def test_the_api_sets_the_logical_date_and_its_deadline_follows(alice_client, dag):
    response = post(alice_client, {"logical_date": NAIVE})
    assert response.status_code == 201, response.json()
    document = response.json()
    assert (document["logical_date"], document["run_id"], _deadline(document)) == (AT, f"manual__{AT}", NEED_BY)
    assert document["queued_at"] != AT
    assert AuditLog.objects.get(action="trigger").details["logical_date"] == AT


def test_runs_may_share_a_logical_date_never_an_id(alice_client, dag):
    ids = [post(alice_client, {"logical_date": date}).json()["run_id"] for date in (NAIVE, "2026-01-31T01:00:00Z", "2026-01-31T03:00:00+02:00")]
    assert ids == [f"manual__{AT}", f"manual__{AT}__2", f"manual__{AT}__3"]
    assert {run.logical_date.isoformat() for run in DagRun.objects.all()} == {AT}


def test_without_a_logical_date_it_is_the_time_the_run_was_queued(alice_client, dag):
    for body in ({}, {"logical_date": None}):
        document = post(alice_client, body).json()
        assert document["logical_date"] == document["queued_at"]
        assert document["run_id"] == f"manual__{document['queued_at']}"


def test_a_date_alone_is_midnight_in_the_dags_timezone(alice_client, dag):
    assert post(alice_client, {"logical_date": "2026-07-01"}).json()["logical_date"] == "2026-06-30T22:00:00+00:00"


@pytest.mark.parametrize("value", [*BAD, 20260131, True, ["2026-01-31"], {"at": NAIVE}, "2026-01-31\u0000"])
def test_the_api_refuses_what_is_not_iso_8601_naming_the_field(alice_client, dag, value):
    response = post(alice_client, {"logical_date": value})
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "logical_date"
    assert "logical_date" in body["error"]
    _nothing_created()


def test_the_openapi_document_describes_the_field(bob_client):
    operation = bob_client.get("/api/v1/openapi.json").json()["paths"]["/dags/{dag_id}/runs"]["post"]
    field = operation["requestBody"]["content"]["application/json"]["schema"]["properties"]["logical_date"]
    assert field["type"] == ["string", "null"]
    assert "ISO 8601" in field["description"]


# --- the command -----------------------------------------------------------------------------


def test_the_command_sets_the_logical_date(capsys, dag):
    call_command("trigger_dag", "etl", "--logical-date", NAIVE)
    run_id = capsys.readouterr().out.splitlines()[0]
    assert run_id == f"manual__{AT}"
    document = run_document(DagRun.objects.get(run_id=run_id))
    assert (document["logical_date"], _deadline(document)) == (AT, NEED_BY)


@pytest.mark.parametrize("value", BAD)
def test_the_command_refuses_what_is_not_iso_8601(dag, value):
    with pytest.raises(CommandError, match="--logical-date"):
        call_command("trigger_dag", "etl", "--logical-date", value)
    _nothing_created()


def test_the_command_exits_1_naming_it(process_env):
    chain_dag("etl")
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "trigger_dag", "etl", "--logical-date", "next tuesday"],
        env=process_env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--logical-date" in done.stderr
    assert "next tuesday" in done.stderr
    assert done.stdout == ""
    _nothing_created()


# --- the console's trigger form --------------------------------------------------------------


def test_the_form_sets_the_logical_date(alice_client, dag):
    assert 'name="logical_date"' in alice_client.get("/dags/etl/").content.decode()
    response = alice_client.post("/dags/etl/trigger", {"conf": "", "logical_date": NAIVE})
    assert response.status_code == 303
    run = DagRun.objects.get()
    assert response["Location"] == f"/dags/etl/runs/{run.run_id}/"
    assert run.logical_date == datetime.fromisoformat(AT)
    assert _deadline(run_document(run)) == NEED_BY


def test_an_empty_field_is_now(alice_client, dag):
    assert alice_client.post("/dags/etl/trigger", {"conf": "", "logical_date": " "}).status_code == 303
    run = DagRun.objects.get()
    assert run.logical_date == run.queued_at


def test_the_form_shows_a_bad_date_beside_the_field(alice_client, dag):
    response = alice_client.post("/dags/etl/trigger", {"conf": '{"k": 1}', "logical_date": "31/01/2026"})
    assert response.status_code == 400
    html = response.content.decode()
    assert '<p class="error" id="logical-date-error" role="alert">logical_date is not an ISO 8601' in html
    assert 'value="31/01/2026" placeholder' in html
    assert "{&quot;k&quot;: 1}" in html
    assert 'id="trigger-error"' not in html
    _nothing_created()


def test_a_trigger_that_loses_its_id_to_another_takes_the_next(dag, monkeypatch):
    """Two triggers at the same logical date at once: the one whose insert meets the other's id
    looks again and takes the next free one (the database's unique id decides)."""
    from orchestrator.engine import run_creation

    first = run_creation.create_manual_run(dag, logical_date=NAIVE)
    free = run_creation._free_run_id
    answers = iter([first.run_id])  # what a trigger that looked just before `first` was inserted saw
    monkeypatch.setattr(run_creation, "_free_run_id", lambda dag, base: next(answers, None) or free(dag, base))
    second = run_creation.create_manual_run(dag, logical_date=NAIVE)
    assert (first.run_id, second.run_id) == (f"manual__{AT}", f"manual__{AT}__2")
    assert DagRun.objects.count() == 2
