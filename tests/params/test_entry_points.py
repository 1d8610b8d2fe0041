"""Every way a run is created checks its conf against the DAG's params, the same way: the CLI,
the API, backfills (CLI and API) and the scheduler. A refusal names the key and creates nothing."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from orchestrator.engine import backfill_runs as backfill_engine
from orchestrator.engine.scheduler import create_due_run
from orchestrator.models import AuditLog, Backfill, BackfillDate, Dag, DagRun, TaskInstance
from tests.params.conftest import PARAMS

pytestmark = pytest.mark.django_db

FILLED = {"mode": "full", "team": "data", "day_offset": 1}


def nothing_created() -> bool:
    return not (DagRun.objects.exists() or TaskInstance.objects.exists() or Backfill.objects.exists() or AuditLog.objects.exists())


def post(client, path: str, body: object):
    return client.post(f"/api/v1{path}", data=json.dumps(body), content_type="application/json")


# --- trigger_dag ----------------------------------------------------------------------------------


def test_trigger_dag_fills_the_defaults_into_the_stored_conf(dag):
    out = StringIO()
    call_command("trigger_dag", "report", "--conf", '{"mode": "full"}', stdout=out)
    run = DagRun.objects.get(run_id=out.getvalue().splitlines()[0])
    assert run.conf == FILLED


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (None, "conf.mode: is required"),
        ('{"mode": "partial"}', "conf.mode: must be one of ['full', 'incremental'], not 'partial'"),
        ('{"mode": "full", "day_offset": "2"}', "conf.day_offset: must be of type integer, not '2'"),
        ('{"mode": "full", "day_offset": 99}', "conf.day_offset: must be at most 30; got 99"),
    ],
)
def test_trigger_dag_refuses_a_bad_conf_naming_the_key(dag, conf, message):
    args = ["--conf", conf] if conf else []
    with pytest.raises(CommandError) as caught:
        call_command("trigger_dag", "report", *args)
    assert message in str(caught.value)
    assert nothing_created()


def test_trigger_dag_refuses_an_unknown_key_with_strict_params(dag):
    Dag.objects.filter(pk=dag.pk).update(strict_params=True)
    with pytest.raises(CommandError, match=r"conf\.tema: is not a declared param"):
        call_command("trigger_dag", "report", "--conf", '{"mode": "full", "tema": "ops"}')
    assert nothing_created()


def test_trigger_dag_refuses_a_conf_nested_too_deeply_without_a_traceback(dag):
    with pytest.raises(CommandError, match="nested too deeply"):
        call_command("trigger_dag", "report", "--conf", '{"mode": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CommandError, match=r"conf\.x: is nested deeper than 64 levels"):
        call_command("trigger_dag", "report", "--conf", '{"mode": "full", "x": ' + "[" * 200 + "]" * 200 + "}")
    assert nothing_created()


def test_trigger_dag_exits_1_naming_the_key(dag, spawn):
    """The real command: exit 1, the key and why on stderr, nothing on stdout, no run."""
    proc = spawn("trigger_dag", "report", "--conf", '{"mode": "both"}')
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "conf.mode: must be one of ['full', 'incremental'], not 'both'" in out
    assert not DagRun.objects.exists()


# --- the API ------------------------------------------------------------------------------------------


def test_the_api_fills_the_defaults(alice_client, dag):
    response = post(alice_client, "/dags/report/runs", {"conf": {"mode": "incremental", "team": "ops"}})
    assert response.status_code == 201, response.content
    assert response.json()["conf"] == {"mode": "incremental", "team": "ops", "day_offset": 1}
    assert DagRun.objects.get().conf == {"mode": "incremental", "team": "ops", "day_offset": 1}


@pytest.mark.parametrize(
    ("conf", "field", "words"),
    [
        ({}, "conf.mode", "is required"),
        (None, "conf.mode", "is required"),
        ({"mode": "full", "day_offset": 1.5}, "conf.day_offset", "must be of type integer, not 1.5"),
        ({"mode": "full", "team": ["a"]}, "conf.team", "must be of type string, not ['a']"),
        ({"mode": "full", "x": json.loads("[" * 70 + "]" * 70)}, "conf.x", "nested deeper than 64 levels"),
        ({"mode": "y" * 1_000_000}, "conf.mode", "must be one of"),
    ],
)
def test_the_api_refuses_a_bad_conf_with_400_naming_the_field(alice_client, dag, conf, field, words):
    response = post(alice_client, "/dags/report/runs", {"conf": conf})
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == field
    assert body["error"].startswith(f"{field}: ")
    assert words in body["error"]
    assert len(body["error"]) < 400
    assert nothing_created()


def test_the_api_refuses_an_unknown_key_with_strict_params(alice_client, dag):
    Dag.objects.filter(pk=dag.pk).update(strict_params=True)
    response = post(alice_client, "/dags/report/runs", {"conf": {"mode": "full", "extra": 1}})
    assert response.status_code == 400
    assert response.json()["field"] == "conf.extra"
    assert nothing_created()


def test_other_errors_have_no_field(alice_client, dag):
    response = post(alice_client, "/dags/report/runs", {"conf": [1]})
    assert response.status_code == 400
    assert "field" not in response.json()


def test_the_dag_document_has_the_declared_params(alice_client, bob_client, dag):
    for client in (alice_client, bob_client):  # reading needs no permission
        doc = client.get("/api/v1/dags/report").json()
        assert doc["params"] == PARAMS
        assert doc["strict_params"] is False
    [listed] = bob_client.get("/api/v1/dags").json()["dags"]
    assert listed["params"] == PARAMS


# --- backfills ----------------------------------------------------------------------------------------


def test_a_backfill_stores_the_filled_conf_and_its_runs_get_it(alice_client, scheduled_dag):
    response = post(alice_client, "/dags/nightly/backfills", {"from": "2026-03-01", "to": "2026-03-02", "conf": {"team": "ops"}})
    assert response.status_code == 201, response.content
    assert response.json()["conf"] == {"team": "ops", "day_offset": 1}
    backfill_engine.start_runs(datetime(2026, 4, 1, tzinfo=timezone.utc))
    assert [run.conf for run in DagRun.objects.all()] == [{"team": "ops", "day_offset": 1}] * 2


def test_the_backfill_api_refuses_a_bad_conf_naming_the_field(alice_client, scheduled_dag):
    for dry_run in (False, True):
        body = {"from": "2026-03-01", "to": "2026-03-02", "conf": {"day_offset": -3}, "dry_run": dry_run}
        response = post(alice_client, "/dags/nightly/backfills", body)
        assert response.status_code == 400
        assert response.json() == {"error": "conf.day_offset: must be at least 0; got -3", "field": "conf.day_offset"}
    assert nothing_created()
    assert not BackfillDate.objects.exists()


def test_the_backfill_command_refuses_a_bad_conf_naming_the_key(scheduled_dag):
    Dag.objects.filter(pk=scheduled_dag.pk).update(strict_params=True)
    for extra in ([], ["--dry-run"]):
        with pytest.raises(CommandError, match=r"conf\.mood: is not a declared param"):
            call_command("backfill", "nightly", "--from", "2026-03-01", "--to", "2026-03-02", "--conf", '{"mood": 1}', *extra)
    assert nothing_created()


def test_the_backfill_command_fills_the_defaults(scheduled_dag):
    out = StringIO()
    call_command("backfill", "nightly", "--from", "2026-03-01", "--to", "2026-03-01", stdout=out)
    assert Backfill.objects.get(pk=int(out.getvalue().split()[0])).conf == {"team": "data", "day_offset": 1}


def test_a_param_declared_after_the_backfill_was_made_gets_its_default(scheduled_dag):
    call_command("backfill", "nightly", "--from", "2026-03-01", "--to", "2026-03-01", stdout=StringIO())
    Dag.objects.filter(pk=scheduled_dag.pk).update(params={**scheduled_dag.params, "late": {"type": "integer", "default": 7}})
    backfill_engine.start_runs(datetime(2026, 4, 1, tzinfo=timezone.utc))
    assert DagRun.objects.get().conf == {"team": "data", "day_offset": 1, "late": 7}


# --- the scheduler ----------------------------------------------------------------------------------


def test_a_scheduled_run_has_the_defaults(scheduled_dag):
    now = datetime(2026, 5, 2, 12, tzinfo=timezone.utc)
    Dag.objects.filter(pk=scheduled_dag.pk).update(next_run_logical_date=datetime(2026, 5, 2, tzinfo=timezone.utc))
    scheduled_dag.refresh_from_db()
    run = create_due_run(scheduled_dag, now)
    assert run is not None
    assert run.run_type == "scheduled"
    assert DagRun.objects.get().conf == {"team": "data", "day_offset": 1}


def test_a_scheduled_run_of_a_dag_lacking_a_default_still_starts(scheduled_dag, caplog):
    """A DAG stored around the rules (no import or admin would take it): the run is not lost and
    the problem is logged, naming the DAG and the param."""
    Dag.objects.filter(pk=scheduled_dag.pk).update(
        params={**PARAMS}, next_run_logical_date=datetime(2026, 5, 2, tzinfo=timezone.utc)
    )
    scheduled_dag.refresh_from_db()
    assert create_due_run(scheduled_dag, datetime(2026, 5, 2, 12, tzinfo=timezone.utc)) is not None
    assert DagRun.objects.get().conf == {"team": "data", "day_offset": 1}
    assert "nightly" in caplog.text
    assert "conf.mode: is required" in caplog.text
