"""GET /api/v1/audit: every kind of action, newest first, filtered and limited; login required;
bad filters are 400s naming the parameter."""
from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from orchestrator.models import AuditLog
from tests.audit.conftest import ACTIONS_OLDEST_FIRST

pytestmark = pytest.mark.django_db

URL = "/api/v1/audit"


def get(client, **params):
    return client.get(f"{URL}?{urlencode(params)}" if params else URL)


def test_it_lists_every_kind_of_action_newest_first(bob_client, history):
    """A viewer reads it: who, what, where, the prior state and the note of each action."""
    response = get(bob_client)
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == len(ACTIONS_OLDEST_FIRST)
    assert [e["action"] for e in body["entries"]] == ACTIONS_OLDEST_FIRST[::-1]
    by_action = {e["action"]: e for e in reversed(body["entries"])}  # the first of each
    assert set(by_action["clear"]) == {
        "at", "user", "action", "dag_id", "run_id", "task_id", "map_index", "prior_state", "new_state", "note", "details"
    }
    clear = next(e for e in body["entries"] if e["action"] == "clear" and e["run_id"] == history.run.run_id)  # the operator's
    assert (clear["user"], clear["dag_id"], clear["run_id"], clear["task_id"]) == ("alice", "etl", history.run.run_id, "load")
    assert (clear["map_index"], clear["prior_state"], clear["new_state"], clear["note"]) == (-1, "failed", "none", "once more")
    assert clear["details"]["include_downstream"] is False
    assert by_action["mark_success"]["note"] == "checked by hand"
    assert by_action["reclassify"]["run_id"] == history.other.run_id
    assert by_action["reclassify"]["note"] == "node drain"
    trigger = by_action["trigger"]
    assert (trigger["task_id"], trigger["map_index"], trigger["details"]["conf"]) == ("", None, {"day": 1})
    circuit = by_action["circuit_open"]
    assert (circuit["dag_id"], circuit["prior_state"], circuit["new_state"], circuit["details"]["circuit"]) == ("", "closed", "open", "payments-api")
    assert by_action["backfill_pause"]["details"]["backfill_id"] == by_action["backfill_create"]["details"]["backfill_id"]
    assert by_action["backfill_rerun"]["user"] == "alice"
    assert by_action["backfill_rerun"]["note"] == "backfill"
    mapped = body["entries"][0]
    assert (mapped["dag_id"], mapped["task_id"], mapped["map_index"], mapped["note"]) == ("mapped", "load", 1, "bad item")
    assert timezone.datetime.fromisoformat(body["entries"][0]["at"]) >= timezone.datetime.fromisoformat(body["entries"][-1]["at"])


def test_it_filters_by_dag_run_task_action_and_user(bob_client, history):
    assert {e["dag_id"] for e in get(bob_client, dag_id="mapped").json()["entries"]} == {"mapped"}
    by_run = get(bob_client, run_id=history.run.run_id).json()
    assert [e["action"] for e in by_run["entries"]] == ["clear", "mark_failed", "mark_success", "trigger"]
    by_task = get(bob_client, dag_id="etl", run_id=history.run.run_id, task_id="load").json()
    assert [e["action"] for e in by_task["entries"]] == ["clear", "mark_failed"]
    marks = get(bob_client, action="mark_failed").json()
    assert marks["count"] == 2
    assert {e["dag_id"] for e in marks["entries"]} == {"etl", "mapped"}
    circuits = get(bob_client, action="circuit_probe").json()["entries"]
    assert [(e["prior_state"], e["new_state"]) for e in circuits] == [("open", "half_open")]
    assert get(bob_client, user="alice").json()["count"] == len(ACTIONS_OLDEST_FIRST)
    assert get(bob_client, user="bob").json() == {"count": 0, "entries": []}
    assert get(bob_client, action="no_such_action").json() == {"count": 0, "entries": []}


def test_since_keeps_the_entries_written_at_or_after_it(bob_client, history):
    entries = get(bob_client).json()["entries"]
    cut = entries[2]["at"]
    after = get(bob_client, since=cut).json()
    assert [e["at"] for e in after["entries"]] == [e["at"] for e in entries if e["at"] >= cut]
    AuditLog.objects.update(at=timezone.now() - timedelta(days=3))
    assert get(bob_client, since=(timezone.now() - timedelta(days=1)).date().isoformat()).json()["count"] == 0
    assert get(bob_client, since="2000-01-01").json()["count"] == len(ACTIONS_OLDEST_FIRST)


def test_limit_pages_the_newest_and_count_says_how_many_match(bob_client, history):
    first = get(bob_client, limit=3).json()
    assert first["count"] == len(ACTIONS_OLDEST_FIRST)
    assert [e["action"] for e in first["entries"]] == ACTIONS_OLDEST_FIRST[::-1][:3]
    # an empty value is an absent one, as a form's empty field sends it
    assert get(bob_client, limit="", since="", dag_id="").json()["count"] == len(ACTIONS_OLDEST_FIRST)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-13-45"}, "since"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "1.5"}, "limit"),
        ({"dag_id": "a\x00b"}, "dag_id"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(bob_client, params, field):
    response = get(bob_client, **params)
    assert response.status_code == 400
    assert field in response.json()["error"]


def test_anonymous_gets_401_json(anonymous_client):
    response = get(anonymous_client, limit="ten")
    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert "error" in response.json()


def test_a_bearer_token_reads_it(bob, client, history):
    from orchestrator.api.tokens import create_token

    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {create_token(bob)}")
    assert response.status_code == 200
    assert response.json()["count"] == len(ACTIONS_OLDEST_FIRST)


def test_the_openapi_document_describes_it(bob_client):
    operation = bob_client.get("/api/v1/openapi.json").json()["paths"]["/audit"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert set(params) == {"dag_id", "run_id", "task_id", "action", "user", "since", "limit"}
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}
    assert "count" in operation["description"]
    assert "limit" in operation["description"]
    assert set(operation["responses"]) == {"200", "400", "401"}
