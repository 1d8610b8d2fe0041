"""A conf that no database can store, or that is not JSON at all, is refused the same way by every
entry point: the console's trigger and backfill forms show the error (never a 500), the API answers
400, the commands exit with an error; nothing is created anywhere."""
from __future__ import annotations

import html
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from orchestrator.engine.run_creation import create_manual_run
from orchestrator.exceptions import BadRequest
from orchestrator.models import AuditLog, Backfill, BackfillDate, DagRun, TaskInstance

pytestmark = pytest.mark.django_db

# (the conf as typed, words the refusal holds). Each is valid for the DAG but for the hostile part.
HOSTILE = [
    pytest.param('{"mode": "full", "x": NaN}', "NaN", id="nan"),
    pytest.param('{"mode": "full", "x": [1, -Infinity]}', "Infinity", id="minus-infinity"),
    pytest.param('{"mode": "full", "x": 1e400}', "finite", id="float-overflowing-to-infinity"),
    pytest.param('{"mode": "full", "x": ' + "7" * 5000 + "}", "digits", id="huge-integer"),
    pytest.param('{"mode": "full", "x": "a\\u0000b"}', "NUL", id="nul-escape"),
    pytest.param('{"mode": "full", "a\\u0000": 1}', "NUL", id="nul-in-a-key"),
    pytest.param('{"mode": "full", "x": {"y": ["\\ud800"]}}', "surrogate", id="lone-surrogate"),
    pytest.param('{"mode": "full", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply", id="nested-past-the-parser"),
    pytest.param('{"mode": "full", "x": ' + "[" * 200 + "]" * 200 + "}", "nested deeper than 64", id="nested-past-the-rule"),
    pytest.param('{"mode": "full", "x": "\\udfff\\ud800"}', "surrogate", id="reversed-surrogate-pair"),
]


def nothing_created() -> bool:
    return not any(model.objects.exists() for model in (DagRun, TaskInstance, Backfill, BackfillDate, AuditLog))


def plain(response) -> str:
    return html.unescape(response.content.decode())


@pytest.mark.parametrize(('conf', 'words'), HOSTILE)
def test_the_trigger_form_shows_the_refusal_and_creates_nothing(alice_client, dag, conf, words):
    response = alice_client.post("/dags/report/trigger", {"conf": conf})
    assert response.status_code == 400, plain(response)[:500]
    page = plain(response)
    assert 'id="trigger-error"' in page
    assert words in page
    assert nothing_created()


def test_a_typed_param_field_is_held_to_the_same_rule(alice_client, dag):
    response = alice_client.post("/dags/report/trigger", {"param.mode": '"full"', "param.day_offset": "NaN"})
    assert response.status_code == 400
    assert "NaN" in plain(response)
    assert 'aria-invalid="true"' in plain(response)
    assert nothing_created()


@pytest.mark.parametrize("step", ["preview", "create"])
@pytest.mark.parametrize(('conf', 'words'), HOSTILE)
def test_the_backfill_form_shows_the_refusal_and_creates_nothing(alice_client, scheduled_dag, conf, words, step):
    conf = conf.replace('"mode": "full", ', "")  # the scheduled DAG has no `mode`
    response = alice_client.post("/dags/nightly/backfill", {"from": "2026-03-01", "to": "2026-03-02", "conf": conf, "step": step})
    assert response.status_code == 400, plain(response)[:500]
    page = plain(response)
    assert words in page
    assert 'aria-invalid="true"' in page
    assert nothing_created()


def test_a_form_over_the_upload_limit_is_a_400_not_a_500(alice_client, dag, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = alice_client.post("/dags/report/trigger", {"conf": json.dumps({"mode": "full", "x": "y" * 20_000})})
    assert response.status_code == 400
    assert nothing_created()


@pytest.mark.parametrize(('conf', 'words'), HOSTILE)
def test_the_api_refuses_with_400(alice_client, dag, scheduled_dag, conf, words):
    response = alice_client.post("/api/v1/dags/report/runs", '{"conf": ' + conf + "}", content_type="application/json")
    assert response.status_code == 400, response.content[:500]
    assert words in response.json()["error"]
    body = '{"from": "2026-03-01", "to": "2026-03-02", "conf": ' + conf.replace('"mode": "full", ', "") + "}"
    response = alice_client.post("/api/v1/dags/nightly/backfills", body, content_type="application/json")
    assert response.status_code == 400, response.content[:500]
    assert words in response.json()["error"]
    assert nothing_created()


@pytest.mark.parametrize(('conf', 'words'), HOSTILE)
def test_the_commands_refuse_with_an_error(dag, scheduled_dag, conf, words):
    with pytest.raises(CommandError) as caught:
        call_command("trigger_dag", "report", "--conf", conf, stdout=StringIO())
    assert words in str(caught.value)
    with pytest.raises(CommandError) as caught:
        call_command("backfill", "nightly", "--from", "2026-03-01", "--to", "2026-03-02", "--conf", conf.replace('"mode": "full", ', ""))
    assert words in str(caught.value)
    assert nothing_created()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), {"k": [float("nan")]}])
def test_the_engine_refuses_a_number_json_cannot_hold_from_any_caller(dag, value):
    """The rule lives where every run is created: a conf made in Python (a listener, a DAG's own
    code, a test) is held to it too."""
    with pytest.raises(BadRequest, match="finite"):
        create_manual_run(dag, conf={"mode": "full", "x": value})
    assert nothing_created()
