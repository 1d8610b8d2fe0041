"""Logging in and out, and that every page asks for it."""
from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import quote

import pytest

from tests.api.factories import chain_dag, make_run
from tests.api.personas import PASSWORD

pytestmark = pytest.mark.django_db

RUN_ID = "manual__2026-01-01T00:00:00+00:00"
PAGES = ["/", "/dags/etl/", f"/dags/etl/runs/{RUN_ID}/", "/failures/", "/audit/"]
POSTS = ["/dags/etl/trigger", f"/dags/etl/runs/{RUN_ID}/tasks/extract/clear"]


@pytest.fixture
def etl_run():
    return make_run(chain_dag("etl"), at=datetime(2026, 1, 1, tzinfo=timezone.utc))


@pytest.mark.parametrize("path", PAGES + POSTS)
def test_it_sends_anonymous_visitors_to_the_login_page(anonymous_client, etl_run, path):
    """Every page (and every form target) redirects an anonymous visitor to log in, keeping ?next."""
    response = anonymous_client.post(path) if path in POSTS else anonymous_client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={quote(path, safe='/')}"


@pytest.mark.parametrize("path", PAGES)
def test_it_shows_every_page_to_a_logged_in_viewer(bob_client, etl_run, path):
    """bob, without permissions, may look at everything."""
    response = bob_client.get(path)
    assert response.status_code == 200
    assert b'hx-headers=\'{"x-csrftoken": "' in response.content
    assert b"/static/vendor/htmx.min.js" in response.content


def test_it_logs_in_with_a_password_and_out_with_a_post(anonymous_client, bob):
    """The login form accepts the right password; logout is a POST form in the nav bar."""
    page = anonymous_client.get("/accounts/login/")
    assert page.status_code == 200
    assert b'name="password"' in page.content
    wrong = anonymous_client.post("/accounts/login/", {"username": "bob", "password": "nope"})
    assert b"didn't match" in wrong.content
    response = anonymous_client.post("/accounts/login/", {"username": "bob", "password": PASSWORD}, follow=True)
    assert response.redirect_chain[-1][0] == "/"
    assert b'action="/accounts/logout/"' in response.content
    anonymous_client.post("/accounts/logout/")
    assert anonymous_client.get("/").status_code == 302
