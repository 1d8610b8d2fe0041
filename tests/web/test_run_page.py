"""The run page: task instances, attempts and output, operator buttons, htmx polling and actions."""
from __future__ import annotations

import pytest

from orchestrator.models import AuditLog, Dag, DagRun
from retries.states import Reason
from tests.api.factories import (
    chain_dag,
    fail,
    fail_until_failed,
    instance,
    make_run,
    succeed,
)

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
XSS = "<script>alert('pwned')</script>"


def page(run: DagRun) -> str:
    return f"/dags/{run.dag.dag_id}/runs/{run.run_id}/"


def action(run: DagRun, task_id: str, name: str) -> str:
    return f"/dags/{run.dag.dag_id}/runs/{run.run_id}/tasks/{task_id}/{name}"


@pytest.fixture
def failed_run():
    """extract failed for good on its only try; the run failed."""
    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract", stdout=f"out {XSS}\n", stderr=f"ValueError: {XSS}\n", detail=XSS)
    return run


def test_it_shows_tasks_attempts_and_why_they_failed(bob_client):
    """Each task's budgets and last failure; each attempt's kind, category, reason, source, metadata and fingerprint."""
    run = make_run(chain_dag("etl", retries=2))
    fail(run, "extract", Reason.WORKER_LOST, fingerprint=None, worker_name="w-7")
    fail(run, "extract", stderr="boom\n")
    html = bob_client.get(page(run)).content.decode()
    assert '<td class="tries" data-label="Tries">attempt 1 of 3</td>' in html  # user try 1 of 3
    assert '<td data-label="Platform retries">1 of 5</td>' in html  # one platform retry of five
    assert 'class="cat cat-application">application</span> task_exception' in html
    assert 'class="kind kind-platform">platform' in html
    assert 'class="kind kind-user">user' in html
    assert "worker_lost" in html
    assert "<td>worker</td>" in html
    assert "<code>4a7c1d9e02bb</code>" in html
    assert '<th scope="row">worker_name</th><td>w-7</td>' in html  # metadata, as a table
    assert '<pre class="log">boom\n</pre>' in html


def test_it_escapes_task_output_and_metadata(bob_client, failed_run):
    """A task's stdout, stderr and failure metadata are shown as text, never as markup."""
    html = bob_client.get(page(failed_run)).content.decode()
    assert XSS not in html
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    assert "out &lt;script&gt;" in html
    assert "ValueError: &lt;script&gt;" in html


def test_it_shows_action_buttons_only_to_operators(alice_client, bob_client, failed_run):
    """alice sees clear, mark success, mark failed and reclassify for the failed task; bob sees none."""
    alice_html = alice_client.get(page(failed_run)).content.decode()
    for name in ("clear", "mark_success", "reclassify"):
        assert f'hx-post="{action(failed_run, "extract", name)}"' in alice_html
    assert f'hx-post="{action(failed_run, "extract", "mark_failed")}"' not in alice_html  # it is failed already
    assert 'hx-target="#run-body"' in alice_html
    bob_html = bob_client.get(page(failed_run)).content.decode()
    assert "hx-post=" not in bob_html


def test_it_polls_an_unfinished_run_and_stops_when_it_ends(bob_client):
    """While the run is unfinished the body polls every 2s; a poll of a finished run answers 286."""
    run = make_run(chain_dag("etl"))
    html = bob_client.get(page(run)).content.decode()
    assert f'hx-get="{page(run)}" hx-trigger="every 2s' in html

    poll = bob_client.get(page(run), **HTMX)
    assert poll.status_code == 200
    assert poll.content.decode().lstrip().startswith('<div id="run-body"')
    assert b"<html" not in poll.content

    for task_id in ("extract", "transform", "load"):
        succeed(run, task_id)
    done = bob_client.get(page(run), **HTMX)
    assert done.status_code == 286
    assert b'id="run-state">success' in done.content
    assert b"hx-trigger" not in done.content
    assert b"hx-trigger" not in bob_client.get(page(run)).content


def test_it_acts_through_htmx_and_answers_with_the_run_body(alice_client, failed_run):
    """An htmx action returns the #run-body partial with the new state, and writes the audit log."""
    Dag.objects.filter(dag_id="etl").update(paused=True)
    response = alice_client.post(action(failed_run, "extract", "clear"), {"include_downstream": "1", "note": "again"}, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="run-body"')
    assert 'id="run-state">running' in html
    assert [instance(failed_run, t).state for t in ("extract", "transform", "load")] == ["none", "none", "none"]
    entry = AuditLog.objects.get()
    assert (entry.username, entry.action, entry.details["note"], entry.details["include_downstream"]) == (
        "alice", "clear", "again", True,
    )


def test_it_reclassifies_with_a_note_from_the_page(alice_client, failed_run):
    """The reclassify form sends its note along."""
    alice_client.post(action(failed_run, "extract", "reclassify"), {"note": "spot instance reclaimed"}, **HTMX)
    attempt = instance(failed_run, "extract").attempts.order_by("attempt_token").first()
    assert attempt.kind == "platform"
    assert attempt.context["metadata"]["note"] == "spot instance reclaimed"


def test_it_shows_a_refused_action_inside_the_partial(alice_client):
    """A conflicting action (nothing to reclassify) shows its reason in the swapped partial."""
    run = make_run(chain_dag("etl"))
    response = alice_client.post(action(run, "extract", "reclassify"), **HTMX)
    assert response.status_code == 200
    assert "has no user-charged failed attempt" in response.content.decode()
    assert not AuditLog.objects.exists()


def test_it_falls_back_to_a_plain_form_post(alice_client, failed_run):
    """Without htmx the action redirects back to the run page; a refusal shows the page with 409."""
    response = alice_client.post(action(failed_run, "extract", "mark_success"))
    assert response.status_code == 303
    assert response["Location"] == page(failed_run)
    assert instance(failed_run, "extract").state == "success"
    refused = alice_client.post(action(failed_run, "extract", "mark_success"))
    assert refused.status_code == 409
    assert "cannot mark success task &#x27;extract&#x27;: it is success" in refused.content.decode()


def test_it_refuses_actions_without_permission(bob_client, failed_run):
    """bob's POST is 403 and changes nothing."""
    assert bob_client.post(action(failed_run, "extract", "clear"), **HTMX).status_code == 403
    assert instance(failed_run, "extract").state == "failed"
    assert not AuditLog.objects.exists()


def test_it_answers_404_for_an_unknown_run_or_task(alice_client, failed_run):
    """Unknown run: 404 page; unknown task: 404 too."""
    assert alice_client.get("/dags/etl/runs/nope/").status_code == 404
    assert alice_client.post(action(failed_run, "nope", "clear")).status_code == 404
