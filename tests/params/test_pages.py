"""The DAG page shows the params; its trigger form has a field per param and puts a refusal beside
it; the backfill form refuses a bad conf too; the admin holds params to the import's rules."""
from __future__ import annotations

import html
import json
import re

import pytest

from orchestrator.models import Backfill, Dag, DagRun
from tests.admin.conftest import dag_post, errors_of
from tests.params.conftest import PARAMS, imported

pytestmark = pytest.mark.django_db


def field_block(page: str, name: str) -> str:
    """The trigger form's block for one param."""
    match = re.search(rf'<div class="param-field" data-param="{name}">(.*?)</div>', page, re.S)
    assert match, f"no field for {name}"
    return match.group(1)


def test_the_page_lists_the_params_and_the_form_has_a_field_per_param(alice_client, dag):
    page = alice_client.get("/dags/report/").content.decode()
    assert 'id="params"' in page
    assert 'data-param="day_offset"' in page
    team = field_block(page, "team")
    assert 'name="param.team"' in team
    assert "who owns the output" in team
    assert "default <code>data</code>" in team
    mode = field_block(page, "mode")
    assert "<select" in mode
    assert "choose one (required)" in mode
    assert '<option value="&quot;full&quot;">full</option>' in mode
    assert "one of <code>full</code>, <code>incremental</code>" in mode
    offset = field_block(page, "day_offset")
    assert "JSON; default <code>1</code>" in offset


def test_a_reader_sees_the_params_but_no_form(bob_client, dag):
    page = bob_client.get("/dags/report/").content.decode()
    assert 'id="params"' in page
    assert 'name="param.team"' not in page


def test_the_form_triggers_with_typed_values_and_defaults(alice_client, dag):
    response = alice_client.post("/dags/report/trigger", {"param.mode": '"incremental"', "param.day_offset": "7", "param.team": "", "conf": '{"note": "x"}'})
    assert response.status_code == 303, response.content.decode()[:2000]
    assert DagRun.objects.get().conf == {"mode": "incremental", "day_offset": 7, "team": "data", "note": "x"}


def test_a_field_is_set_over_the_conf_text(alice_client, dag):
    alice_client.post("/dags/report/trigger", {"param.mode": '"full"', "param.team": "ops", "conf": '{"team": "web", "mode": "incremental"}'})
    assert DagRun.objects.get().conf == {"mode": "full", "team": "ops", "day_offset": 1}


@pytest.mark.parametrize(
    ('data', 'param', 'words'),
    [
        ({"param.day_offset": "99", "param.mode": '"full"'}, "day_offset", "must be at most 30; got 99"),
        ({"param.day_offset": "seven", "param.mode": '"full"'}, "day_offset", "is not valid JSON"),
        ({}, "mode", "is required: the DAG declares this param without a default"),
        ({"conf": '{"mode": "partial"}'}, "mode", "must be one of"),
    ],
)
def test_a_refusal_is_shown_beside_its_field(alice_client, dag, data, param, words):
    response = alice_client.post("/dags/report/trigger", data)
    assert response.status_code == 400
    page = response.content.decode()
    block = field_block(page, param)
    assert 'aria-invalid="true"' in block
    assert words in html.unescape(block)
    assert 'id="trigger-error"' not in page  # not above the form: beside the field
    assert not DagRun.objects.exists()


def test_typed_values_are_kept_after_a_refusal(alice_client, dag):
    response = alice_client.post("/dags/report/trigger", {"param.day_offset": "99", "param.team": "ops", "param.mode": '"full"'})
    page = response.content.decode()
    assert 'value="ops"' in field_block(page, "team")
    assert 'value="99"' in field_block(page, "day_offset")
    assert 'value="&quot;full&quot;" selected' in field_block(page, "mode")


def test_a_key_that_is_not_a_param_is_refused_above_the_form(alice_client, dag):
    Dag.objects.filter(pk=dag.pk).update(strict_params=True)
    response = alice_client.post("/dags/report/trigger", {"param.mode": '"full"', "conf": '{"extra": 1}'})
    assert response.status_code == 400
    assert "conf.extra: is not a declared param" in html.unescape(response.content.decode())
    assert not DagRun.objects.exists()


def test_the_page_escapes_what_a_dag_author_wrote(alice_client, db):
    evil = '<script>alert("x")</script>'
    imported(
        {
            "dag_id": "evil",
            "params": {
                "p": {"type": "string", "default": evil, "description": evil, "enum": [evil, "ok"]},
                "q": {"description": evil, "default": {"k": evil}},
            },
            "tasks": [{"task_id": "a", "bash_command": "true"}],
        }
    )
    page = alice_client.get("/dags/evil/").content.decode()
    assert "<script>" not in page
    assert "&lt;script&gt;" in page


def test_the_page_escapes_what_a_triggerer_typed(alice_client, dag):
    evil = '"><script>alert(1)</script>'
    page = alice_client.post("/dags/report/trigger", {"param.team": evil, "param.day_offset": evil}).content.decode()
    assert "<script>" not in page


def test_the_backfill_form_refuses_a_bad_conf(alice_client, scheduled_dag):
    response = alice_client.post("/dags/nightly/backfill", {"from": "2026-03-01", "to": "2026-03-02", "conf": '{"day_offset": "x"}'})
    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert "conf.day_offset: must be of type integer, not 'x'" in page
    assert re.search(r'<textarea name="conf"[^>]*aria-invalid="true"', page)
    assert not Backfill.objects.exists()


# --- the admin --------------------------------------------------------------------------------------


def test_the_admin_saves_params(admin_client):
    response = admin_client.post("/admin/orchestrator/dag/add/", dag_post(params=json.dumps(PARAMS), strict_params="on", tasks=[{"task_id": "a", "bash_command": "true"}]))
    assert response.status_code == 302, errors_of(response)
    dag = Dag.objects.get(dag_id="payments")
    assert dag.params == PARAMS
    assert dag.strict_params is True


@pytest.mark.parametrize(
    ('fields', 'words'),
    [
        ({"params": '{"n": {"type": "integer", "default": "x"}}'}, "n.default: does not match the param&#x27;s own schema"),
        ({"params": '{"n": {"type": "nope"}}'}, "is not a valid JSON Schema"),
        ({"params": '{"n": {"type": "integer"}}', "schedule": "@daily"}, "n: has no default, so the DAG cannot have a schedule"),
        ({"params": "[1]"}, "must be a mapping of param names"),
    ],
)
def test_the_admin_refuses_what_an_import_refuses(admin_client, fields, words):
    response = admin_client.post("/admin/orchestrator/dag/add/", dag_post(tasks=[{"task_id": "a", "bash_command": "true"}], **fields))
    assert words in errors_of(response)
    assert not Dag.objects.exists()
