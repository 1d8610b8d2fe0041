"""Hit-rate history: the pure summary, the per-DAG/per-task record, its endpoint and its partial."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.utils import timezone

from deadlines.history import dag_deadline_history, history, summarize
from deadlines.models import Deadline
from orchestrator.api.tokens import create_token
from orchestrator.models import Dag, DagRun
from tests.deadlines.factories import chain_dag


def row(state: str, lateness: float | None = None, warned: bool = False) -> dict:
    return {"state": state, "lateness_seconds": lateness, "warned_at": timezone.now() if warned else None}


def test_it_summarizes_hit_rate_and_lateness():
    """hit_rate = met / (met + missed); lateness figures over settled rows; open rows only counted."""
    summary = summarize([row("met", -30), row("met", -10), row("missed", 20, warned=True), row("missed", 40), row("pending")])
    assert summary["total"] == 5
    assert (summary["met"], summary["missed"], summary["pending"], summary["at_risk"], summary["warned"]) == (2, 2, 1, 0, 1)
    assert summary["hit_rate"] == 0.5
    assert summary["median_lateness_seconds"] == 5.0
    assert summary["mean_lateness_missed_seconds"] == 30.0
    assert summary["max_lateness_seconds"] == 40.0


def test_it_has_no_hit_rate_before_anything_settled():
    """Nothing met or missed yet: the hit rate is unknown, not 0 %."""
    assert summarize([row("pending")])["hit_rate"] is None
    assert summarize([])["hit_rate"] is None


def make_history(dag_id: str = "daily") -> None:
    """Five runs: the DAG deadline met in 3 and missed in 2; task 'load' met once, missed once."""
    dag = chain_dag(dag_id, ("extract", "load"))
    base = timezone.now() - timedelta(days=10)
    for i, (state, lateness) in enumerate([("met", -60), ("missed", 120), ("met", -5), ("missed", 30), ("met", -1)]):
        when = base + timedelta(days=i)
        run = DagRun.objects.create(dag=dag, run_id=f"scheduled__{i}", run_type="scheduled", state="success",
                                    logical_date=when, queued_at=when, start_date=when, end_date=when)
        Deadline.objects.create(dag_run=run, reference="dagrun_queued_at", callback="notifier:log", need_by=when,
                                state=state, lateness_seconds=lateness)
        if i >= 3:
            Deadline.objects.create(dag_run=run, scope="task", task_id="load", reference="task_started_at",
                                    callback="notifier:log", need_by=when, state="met" if i == 4 else "missed",
                                    lateness_seconds=-2 if i == 4 else 7)


@pytest.mark.django_db
def test_it_reports_the_dag_record_over_the_last_runs_with_a_per_task_breakdown():
    """history(dag, last=N): DAG-level deadlines of the newest N runs, plus each task's summary."""
    make_history()
    record = history(Dag.objects.get(dag_id="daily"), last=3)
    assert (record["dag_id"], record["task_id"], record["last"], record["runs"]) == ("daily", None, 3, 3)
    assert (record["summary"]["met"], record["summary"]["missed"]) == (2, 1)
    assert [r["run_id"] for r in record["recent"]] == ["scheduled__4", "scheduled__3", "scheduled__2"]
    assert record["tasks"]["load"]["hit_rate"] == 0.5


@pytest.mark.django_db
def test_it_reports_one_task_record():
    """history(dag, task_id=...) covers only that task's deadlines."""
    make_history()
    record = history(Dag.objects.get(dag_id="daily"), task_id="load", last=20)
    assert (record["summary"]["total"], record["summary"]["met"], record["summary"]["missed"]) == (2, 1, 1)
    assert {r["task_id"] for r in record["recent"]} == {"load"}
    assert "tasks" not in record


@pytest.mark.django_db
def test_it_gives_the_dag_page_one_row_per_scope():
    """dag_deadline_history(dag): rows for the DAG and for each task with deadlines."""
    make_history()
    rows = dag_deadline_history(Dag.objects.get(dag_id="daily"))
    assert [(r["label"], r["met"], r["missed"], r["hit_rate"]) for r in rows] == [("DAG", 3, 2, 0.6), ("task load", 1, 1, 0.5)]


# --- the endpoint, by persona --------------------------------------------------------------------


@pytest.fixture
def alice(db) -> User:
    return User.objects.create_user("alice", password="pw-alice-123")


URL = "/api/v1/dags/daily/deadlines/history"


@pytest.mark.django_db
def test_it_requires_login_or_a_token(client):
    """Anonymous: 401 JSON, no data."""
    make_history()
    response = client.get(URL)
    assert response.status_code == 401
    assert "error" in response.json()


@pytest.mark.django_db
def test_it_serves_the_record_to_a_logged_in_user(client, alice):
    """A session user gets the JSON record; task_id and last filter it."""
    make_history()
    client.force_login(alice)
    body = client.get(URL, {"last": 2}).json()
    assert (body["runs"], body["summary"]["met"], body["summary"]["missed"]) == (2, 1, 1)
    body = client.get(URL, {"task_id": "load"}).json()
    assert body["task_id"] == "load"
    assert body["summary"]["total"] == 2


@pytest.mark.django_db
def test_it_serves_the_record_to_a_bearer_token(client, alice):
    """An API client with a token gets the same record."""
    make_history()
    token = create_token(alice)
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert response.json()["dag_id"] == "daily"


@pytest.mark.django_db
def test_it_rejects_a_bad_last_and_an_unknown_dag(client, alice):
    """Bad input gets a clear JSON error naming the parameter and value."""
    make_history()
    client.force_login(alice)
    response = client.get(URL, {"last": "lots"})
    assert response.status_code == 400
    assert "last must be a whole number" in response.json()["error"]
    assert "'lots'" in response.json()["error"]
    assert client.get("/api/v1/dags/nope/deadlines/history").status_code == 404


@pytest.mark.django_db
def test_it_renders_the_partial_for_htmx(client, alice):
    """With HX-Request the endpoint answers with the deadlines/_history.html partial."""
    make_history()
    client.force_login(alice)
    response = client.get(URL, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="deadline-history-record"' in html
    assert "60%" in html
    assert "load" in html


def test_it_escapes_everything_in_the_partial():
    """Values from the database are escaped in the partial."""
    evil = "<script>alert(1)</script>"
    record = {
        "dag_id": "x", "task_id": evil, "last": 1, "runs": 1,
        "summary": summarize([row("missed", 5)]),
        "tasks": {evil: summarize([row("met", -1)])},
        "recent": [{"run_id": evil, "logical_date": None, "task_id": evil, "reference": "dagrun_queued_at", "need_by": evil,
                    "state": "missed", "lateness_seconds": 5.0, "warned": False, "callback_state": evil}],
    }
    html = render_to_string("deadlines/_history.html", {"history": record})
    assert evil not in html
    assert "&lt;script&gt;" in html
