"""The DAG page's grid (runs × tasks), its polling, duration bars, deadline SVG and "needs attention"."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from deadlines.models import Deadline
from orchestrator.models import DagRun, TaskInstance
from tests.api.factories import chain_dag, fail, make_run, start, succeed

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def dead_letter(run, task_id: str = "extract") -> None:
    fail(run, task_id)
    TaskInstance.objects.filter(dag_run=run, task_id=task_id).update(next_retry_at=timezone.now() - timedelta(seconds=1))
    assert fail(run, task_id).state == "dead_letter"


def test_it_draws_a_cell_per_run_and_task_linking_to_the_task_page(bob_client):
    dag = chain_dag("etl", retries=3)
    runs = [make_run(dag, at=timezone.now() + timedelta(seconds=i)) for i in range(3)]
    for task_id in ("extract", "transform", "load"):
        succeed(runs[0], task_id)
    start(runs[1], "extract")
    html = bob_client.get("/dags/etl/").content.decode()
    assert html.count('class="sq state-') >= 9
    assert f'href="/dags/etl/runs/{runs[0].run_id}/tasks/load" class="sq state-success"' in html
    assert f'href="/dags/etl/runs/{runs[1].run_id}/tasks/extract" class="sq state-running"' in html
    # oldest run first (left), like a timeline
    assert html.index(runs[0].run_id) < html.index(runs[2].run_id)
    assert 'class="dur dur-success" style="height:' in html


def test_it_marks_platform_retries_and_waiting_tasks(bob_client):
    from retries.states import Reason

    run = make_run(chain_dag("etl", retries=3))
    fail(run, "extract", Reason.WORKER_LOST, fingerprint=None)
    html = bob_client.get("/dags/etl/").content.decode()
    assert "platform" in html
    assert "1 platform retry" in html


def test_it_polls_while_a_run_is_active_and_stops_with_286(bob_client):
    run = make_run(chain_dag("etl"))
    html = bob_client.get("/dags/etl/").content.decode()
    assert 'id="dag-grid" hx-get="/dags/etl/" hx-trigger="every 2s"' in html
    poll = bob_client.get("/dags/etl/", **HTMX)
    assert poll.status_code == 200
    assert poll.content.decode().lstrip().startswith('<section id="dag-grid"')
    DagRun.objects.filter(pk=run.pk).update(state="success", end_date=timezone.now())
    done = bob_client.get("/dags/etl/", **HTMX)
    assert done.status_code == 286
    assert b"hx-trigger" not in done.content


def test_a_run_with_a_dead_letter_needs_attention_everywhere_runs_are_listed(bob_client):
    run = make_run(chain_dag("etl", retries=9, poison_threshold=2))
    dead_letter(run)
    run.refresh_from_db()
    dag_page = bob_client.get("/dags/etl/").content.decode()
    assert "needs attention" in dag_page
    assert f"sq state-{run.state} attention" in dag_page
    dag_list = bob_client.get("/").content.decode()
    assert ">needs attention</a>" in dag_list


def test_it_draws_the_deadline_history(bob_client):
    dag = chain_dag("etl")
    met, missed = make_run(dag), make_run(dag, at=timezone.now() + timedelta(seconds=1))
    now = timezone.now()
    Deadline.objects.create(dag_run=met, scope="dag", reference="dagrun_queued_at", callback="notifier:log", need_by=now, state="met", lateness_seconds=-30)
    Deadline.objects.create(dag_run=missed, scope="dag", reference="dagrun_queued_at", callback="notifier:log", need_by=now, state="missed", lateness_seconds=125)
    html = bob_client.get("/dags/etl/").content.decode()
    assert '<svg class="chart"' in html
    assert "missed by 2 min 05 s" in html
    assert "met, 30 s early" in html


def test_its_query_count_does_not_grow_with_runs(bob_client, django_assert_max_num_queries):
    dag = chain_dag("etl", task_ids=tuple(f"t{i}" for i in range(10)))
    for i in range(30):
        make_run(dag, at=timezone.now() + timedelta(seconds=i))
    with django_assert_max_num_queries(16):
        assert bob_client.get("/dags/etl/").status_code == 200
    with django_assert_max_num_queries(8):
        bob_client.get("/dags/etl/", **HTMX)
    with django_assert_max_num_queries(8):
        assert bob_client.get("/").status_code == 200


def test_it_escapes_what_users_wrote(bob_client):
    dag = chain_dag("etl")
    dag.description = "<b>bold</b>"
    dag.save()
    make_run(dag)
    html = bob_client.get("/dags/etl/").content.decode()
    assert "<b>bold</b>" not in html
