"""The audit page reads the API's query: the same filters, the same entries, a bad filter shown."""
from __future__ import annotations

import re

import pytest

from tests.audit.conftest import ACTIONS_OLDEST_FIRST

pytestmark = pytest.mark.django_db


def actions_shown(html: str) -> list[str]:
    body = html.split("<tbody>")[1]
    return re.findall(r"<tr>\s*<td class=\"nowrap\">[^<]*</td>\s*<td class=\"who\">.*?</td>\s*<td>([a-z_]+)</td>", body, re.S)


@pytest.mark.parametrize(
    "query",
    [{}, {"dag_id": "etl", "task_id": "load"}, {"action": "mark_failed"}, {"user": "alice", "limit": "4"}, {"since": "2000-01-01"}],
)
def test_it_shows_what_the_api_answers(bob_client, history, query):
    html = bob_client.get("/audit/", query).content.decode()
    entries = bob_client.get("/api/v1/audit", query).json()
    assert actions_shown(html) == [e["action"] for e in entries["entries"]]
    assert f'{entries["count"]} entr' in html


def test_it_filters_by_run_and_names_a_mapped_instance(bob_client, history):
    html = bob_client.get("/audit/", {"run_id": history.mapped.run_id}).content.decode()
    assert actions_shown(html) == ["mark_failed"]
    assert "<td>load[1]</td>" in html
    assert actions_shown(bob_client.get("/audit/").content.decode()) == ACTIONS_OLDEST_FIRST[::-1]


@pytest.mark.parametrize(("query", "named"), [({"since": "whenever"}, "since"), ({"limit": "-2"}, "limit")])
def test_a_bad_filter_is_shown_not_a_server_error(bob_client, query, named):
    response = bob_client.get("/audit/", query)
    assert response.status_code == 400
    assert re.search(rf'<p class="error" id="audit-filter-error">invalid {named} ', response.content.decode())


def test_anonymous_is_sent_to_log_in(anonymous_client):
    response = anonymous_client.get("/audit/")
    assert response.status_code == 302
    assert "/login" in response["Location"]
