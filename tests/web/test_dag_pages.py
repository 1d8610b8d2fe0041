"""The DAG list and the DAG page (with its trigger form and deadline history partial)."""
from __future__ import annotations

import pytest
from django.template.loader import render_to_string

from orchestrator.models import AuditLog, Dag, DagRun
from tests.api.factories import DagFactory, chain_dag, fail_until_failed, make_run

pytestmark = pytest.mark.django_db


def test_it_lists_dags_with_schedule_pause_and_last_runs(bob_client):
    """The list shows each DAG's schedule, paused flag, next run and last run states."""
    etl = chain_dag("etl", retries=0)
    Dag.objects.filter(pk=etl.pk).update(schedule="0 2 * * *")
    DagFactory(dag_id="nightly", paused=True, description="<b>bold</b> claims")
    failed = make_run(etl)
    fail_until_failed(failed, "extract")

    html = bob_client.get("/").content.decode()

    assert "0 2 * * *" in html
    assert 'class="badge paused">paused' in html
    assert f'class="state state-failed" href="/dags/etl/runs/{failed.run_id}/"' in html
    assert "&lt;b&gt;bold&lt;/b&gt; claims" in html
    assert "<b>bold</b>" not in html


def test_it_shows_a_dag_with_its_tasks_and_runs(bob_client):
    """The DAG page lists tasks (with effective retries) and recent runs."""
    etl = chain_dag("etl", retries=4)
    run = make_run(etl)
    html = bob_client.get("/dags/etl/").content.decode()
    assert "extract" in html
    assert "transform" in html
    assert "<td>4</td>" in html
    assert run.run_id in html


def test_it_answers_404_for_an_unknown_dag(bob_client):
    """An unknown DAG is a 404 page."""
    assert bob_client.get("/dags/nope/").status_code == 404


def test_it_shows_the_trigger_form_only_to_those_who_may_trigger(alice_client, bob_client):
    """alice sees the trigger form; bob does not, and his POST is 403."""
    chain_dag("etl")
    assert b'action="/dags/etl/trigger"' in alice_client.get("/dags/etl/").content
    assert b'action="/dags/etl/trigger"' not in bob_client.get("/dags/etl/").content
    assert bob_client.post("/dags/etl/trigger", {"conf": "{}"}).status_code == 403
    assert not DagRun.objects.exists()


def test_it_triggers_a_run_from_the_form(alice_client):
    """A valid conf creates the run and redirects to its page."""
    chain_dag("etl")
    response = alice_client.post("/dags/etl/trigger", {"conf": '{"day": "2026-11-21"}'})
    run = DagRun.objects.get()
    assert response.status_code == 303
    assert response["Location"] == f"/dags/etl/runs/{run.run_id}/"
    assert run.conf == {"day": "2026-11-21"}
    assert run.triggered_by == "alice"
    assert AuditLog.objects.get().action == "trigger"


@pytest.mark.parametrize(
    ("conf", "status", "message"),
    [("[1]", 400, "conf must be a JSON object"), ("{oops", 400, "conf is not valid JSON")],
)
def test_it_shows_why_a_trigger_was_refused(alice_client, conf, status, message):
    """Bad conf: the page again, with the reason and the conf as typed."""
    chain_dag("etl")
    response = alice_client.post("/dags/etl/trigger", {"conf": conf})
    assert response.status_code == status
    assert message in response.content.decode()
    assert not DagRun.objects.exists()


def test_a_paused_dags_run_is_shown_queued_with_why(alice_client):
    chain_dag("etl")
    Dag.objects.filter(dag_id="etl").update(paused=True)
    response = alice_client.post("/dags/etl/trigger", {"conf": "{}"}, follow=True)
    run = DagRun.objects.get()
    assert run.state == "queued"
    assert response.redirect_chain[-1][0] == f"/dags/etl/runs/{run.run_id}/"
    assert "is paused: the run is queued and starts once the DAG is unpaused" in response.content.decode()


def test_it_renders_the_deadline_history_partial():
    """The deadline_history partial shows rows of met, missed and hit rate when given, and nothing otherwise."""
    rows = [{"label": "DAG", "met": 3, "missed": 1, "hit_rate": 0.75}, {"label": "task <x>", "met": 0, "missed": 0, "hit_rate": None}]
    html = render_to_string("web/dag_detail.html#deadline_history", {"dag_deadline_history": rows})
    assert "Deadline hit rate" in html
    assert "75%" in html
    assert "task &lt;x&gt;" in html
    assert "Deadline hit rate" not in render_to_string("web/dag_detail.html#deadline_history", {})


def test_it_pauses_and_unpauses_a_dag_from_its_page(alice_client):
    """An operator with change_dag pauses and unpauses the DAG; each change is audited once."""
    DagFactory(dag_id="nightly")
    assert 'name="paused" value="1"' in alice_client.get("/dags/nightly/").content.decode()
    response = alice_client.post("/dags/nightly/pause", {"paused": "1"})
    assert response.status_code == 303
    assert Dag.objects.get(dag_id="nightly").paused
    alice_client.post("/dags/nightly/pause", {"paused": "1"})  # already paused: nothing to record
    alice_client.post("/dags/nightly/pause", {"paused": "0"})
    assert not Dag.objects.get(dag_id="nightly").paused
    audit = list(AuditLog.objects.filter(dag_id="nightly").order_by("id").values_list("action", "prior_state", "new_state"))
    assert audit == [("pause", "active", "paused"), ("unpause", "paused", "active")]


def test_it_requires_change_permission_to_pause(bob_client, anonymous_client):
    """A viewer gets 403 and sees no button; an anonymous user is sent to log in."""
    DagFactory(dag_id="nightly")
    assert 'id="pause-form"' not in bob_client.get("/dags/nightly/").content.decode()
    assert bob_client.post("/dags/nightly/pause", {"paused": "1"}).status_code == 403
    assert anonymous_client.post("/dags/nightly/pause", {"paused": "1"}).status_code == 302
    assert not Dag.objects.get(dag_id="nightly").paused
