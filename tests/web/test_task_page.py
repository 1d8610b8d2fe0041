"""The task instance page: attempts to scale, contexts as tables, output once, actions explained."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orchestrator.models import AuditLog, TaskAttempt, TaskInstance
from retries.states import Reason
from tests.api.factories import chain_dag, fail, fail_until_failed, instance, make_run, start, succeed

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
XSS = "<script>alert('pwned')</script>"


def page(run, task_id: str = "extract") -> str:
    return f"/dags/{run.dag.dag_id}/runs/{run.run_id}/tasks/{task_id}"


def due(task_id: str = "extract") -> None:
    TaskInstance.objects.filter(task_id=task_id).update(next_retry_at=timezone.now() - timedelta(seconds=1))


@pytest.fixture
def failed_run():
    run = make_run(chain_dag("etl", retries=1))
    fail(run, "extract", Reason.WORKER_LOST, fingerprint=None)
    fail_until_failed(run, "extract", stdout=f"out {XSS}\n", stderr=f"Traceback ...\nValueError: {XSS}\n", traceback=f"Traceback ...\nValueError: {XSS}\n", message=XSS)
    return run


def test_it_shows_every_attempt_with_its_context_as_a_table(bob_client, failed_run):
    html = bob_client.get(page(failed_run)).content.decode()
    assert html.count('class="attempt card"') == 3
    assert "platform retry" in html
    assert "user try" in html
    assert '<th scope="row">reason</th><td>worker_lost</td>' in html
    assert '<th scope="row">exception_type</th><td>ValueError</td>' in html
    assert "attempt 2 of 2" in html
    assert "1 of 5 used" in html
    assert 'class="timeline"' in html
    assert "margin-left:" in html
    assert "test-worker on test-host (pid 4242)" in html


def test_it_escapes_output_and_shows_the_traceback_once(bob_client, failed_run):
    html = bob_client.get(page(failed_run)).content.decode()
    assert XSS not in html
    assert "ValueError: &lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    # the traceback is in stderr: the attempt shows it there only, not again from the context
    last = html.split('id="attempt-')[-1]
    assert last.count("Traceback ...") == 1


def test_it_serves_the_whole_output_as_plain_text(bob_client, failed_run):
    attempt = instance(failed_run, "extract").attempts.order_by("-attempt_token").first()
    response = bob_client.get(f"{page(failed_run)}/attempts/{attempt.attempt_token}/stderr.txt")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response.content.decode() == f"Traceback ...\nValueError: {XSS}\n"
    assert bob_client.get(f"{page(failed_run)}/attempts/999/stderr.txt").status_code == 404
    assert bob_client.get(f"{page(failed_run)}/attempts/{attempt.attempt_token}/env.txt").status_code == 404


def test_long_output_shows_head_and_tail(bob_client):
    run = make_run(chain_dag("etl", retries=0))
    lines = "".join(f"line {i}\n" for i in range(500))
    fail_until_failed(run, "extract", stdout=lines)
    html = bob_client.get(page(run)).content.decode()
    assert "line 0\n" in html
    assert "line 499\n" in html
    assert "line 250\n" not in html
    assert "400 lines not shown" in html


def test_it_explains_each_action_before_confirming(alice_client, failed_run):
    html = alice_client.get(page(failed_run)).content.decode()
    assert "Clear: The task runs again with 2 more tries (up to attempt 4)" in html
    assert "Reclassify as platform failure: Its last user-charged failure is charged to the platform" in html
    assert "(attempt 2 of 2 again), using platform retry 2 of 5" in html
    assert "Mark success: The task is recorded as succeeded" in html
    assert 'name="note"' in html
    assert "Confirm clear" in html
    assert "hx-confirm" not in html  # confirmation is on the page, not a browser dialog


def test_a_viewer_sees_no_buttons_and_is_refused(bob_client, failed_run):
    html = bob_client.get(page(failed_run)).content.decode()
    assert "Confirm" not in html
    assert 'id="actions"' not in html
    assert bob_client.post(f"{page(failed_run)}/clear", {"back": "task"}).status_code == 403
    assert not AuditLog.objects.exists()


def test_clear_from_the_task_page_keeps_the_note_and_answers_with_the_page(alice_client, failed_run):
    response = alice_client.post(f"{page(failed_run)}/clear", {"back": "task", "note": "fixed the source"}, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="task-body"')
    assert instance(failed_run, "extract").state in ("none", "scheduled", "queued")
    entry = AuditLog.objects.get()
    assert (entry.action, entry.details["note"]) == ("clear", "fixed the source")
    plain = alice_client.post(f"{page(failed_run)}/mark_failed", {"back": "task"})
    assert plain.status_code in (303, 409)


def test_reclassify_repeats_the_same_try(alice_client, failed_run):
    alice_client.post(f"{page(failed_run)}/reclassify", {"back": "task", "note": "node drained"})
    ti = instance(failed_run, "extract")
    assert ti.state in ("scheduled", "queued")
    assert (ti.try_number, ti.max_tries, ti.infrastructure_try_number) == (2, 2, 2)
    html = alice_client.get(page(failed_run)).content.decode()
    assert "attempt 2 of 2" in html
    assert "2 of 5 used" in html


def test_mark_failed_stops_a_running_task(alice_client):
    run = make_run(chain_dag("etl"))
    start(run, "extract")
    html = alice_client.get(page(run)).content.decode()
    assert "Stops the running task on test-worker" in html
    response = alice_client.post(f"{page(run)}/mark_failed", {"back": "task", "note": "runaway"})
    assert response.status_code == 303
    ti = instance(run, "extract")
    assert ti.state == "failed"
    assert ti.last_failure_context["category"] == "user_action"
    assert ti.last_failure_context["reason"] == "manual_mark_failed"
    assert ti.last_failure_context["metadata"]["note"] == "runaway"
    attempt = TaskAttempt.objects.get(task_instance=ti)
    assert attempt.state == "failed"
    assert attempt.context["reason"] == "manual_mark_failed"
    assert AuditLog.objects.get().details["stopped"] is True


def test_a_succeeded_task_reads_its_last_failure_as_history(bob_client):
    run = make_run(chain_dag("etl", retries=2))
    fail(run, "extract")
    due()
    succeed(run, "extract")
    html = bob_client.get(page(run)).content.decode()
    assert "(history: the task is success now)" in html
    assert "Why it failed" not in html
    run_html = bob_client.get(f"/dags/etl/runs/{run.run_id}/").content.decode()
    assert "earlier: application task_exception" in run_html


def test_the_fingerprint_links_to_every_instance_that_failed_the_same_way(bob_client):
    first, second = make_run(chain_dag("etl", retries=0)), None
    fail_until_failed(first, "extract")
    second = make_run(first.dag, at=timezone.now() + timedelta(seconds=1))
    fail_until_failed(second, "extract")
    html = bob_client.get(page(first)).content.decode()
    assert 'href="/fingerprints/4a7c1d9e02bb/"' in html
    listing = bob_client.get("/fingerprints/4a7c1d9e02bb/").content.decode()
    assert page(first) in listing
    assert page(second) in listing


def test_bad_input_is_a_404(bob_client, failed_run):
    assert bob_client.get(page(failed_run, "nope")).status_code == 404
    assert bob_client.get("/dags/etl/runs/nope/tasks/extract").status_code == 404


def test_htmx_polls_an_active_task_and_stops_when_it_is_done(bob_client, failed_run):
    assert bob_client.get(page(failed_run), **HTMX).status_code == 286
    run = make_run(chain_dag("other"))
    start(run, "extract")
    poll = bob_client.get(page(run), **HTMX)
    assert poll.status_code == 200
    assert b"hx-trigger" in poll.content


def test_its_query_count_does_not_grow_with_attempts(bob_client, django_assert_max_num_queries):
    run = make_run(chain_dag("etl", retries=20))
    for _ in range(15):
        fail(run, "extract")
        due()
    with django_assert_max_num_queries(12):
        assert bob_client.get(page(run)).status_code == 200
