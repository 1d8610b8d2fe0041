"""404, 403 and 500 pages in the console's layout, saying what is missing and with a way back."""
from __future__ import annotations

import pytest
from django.test import RequestFactory, override_settings
from django.views.defaults import server_error

from tests.api.factories import chain_dag, make_run

pytestmark = pytest.mark.django_db


@override_settings(DEBUG=False)
def test_a_missing_dag_or_run_is_a_styled_404_naming_it(bob_client):
    response = bob_client.get("/dags/no_such_dag/")
    html = response.content.decode()
    assert response.status_code == 404
    assert '<link rel="stylesheet"' in html
    assert 'class="topbar"' in html
    assert "Unknown DAG &#x27;no_such_dag&#x27;." in html
    assert '<a href="/">Back to the DAGs</a>' in html
    run = make_run(chain_dag("etl"))
    html = bob_client.get(f"/dags/etl/runs/{run.run_id}x/").content.decode()
    assert f"DAG &#x27;etl&#x27; has no run &#x27;{run.run_id}x&#x27;." in html


@override_settings(DEBUG=False)
def test_an_unknown_address_names_the_path_escaped(bob_client):
    response = bob_client.get("/nowhere/<b>x</b>")
    html = response.content.decode()
    assert response.status_code == 404
    assert "There is no page at" in html
    assert "<b>x</b>" not in html
    assert "Back to the DAGs" in html


@override_settings(DEBUG=False)
def test_a_refused_action_is_a_styled_403_naming_the_permission(bob_client):
    chain_dag("etl")
    response = bob_client.post("/dags/etl/pause", {"paused": "1"})
    html = response.content.decode()
    assert response.status_code == 403
    assert "Not allowed" in html
    assert "orchestrator.change_dag" in html
    assert "Back to the DAGs" in html


def test_a_server_error_is_a_styled_500_without_the_request_context(db):
    """Django renders 500.html without a context: the page must not need one."""
    response = server_error(RequestFactory().get("/dags/etl/"))
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on our side" in html
    assert 'href="/"' in html
    assert 'class="topbar"' in html
