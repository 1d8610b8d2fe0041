"""The WSGI app (what gunicorn serves) keeps its database connection from one request to the next,
unless DATABASE_URL says otherwise; the processes that are not the web server are not affected."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# Two API requests through the WSGI app, each looking a bearer token up in the database (an unknown
# one: 401); after each, the connection the request used, if it is still open.
SCRIPT = """
import io, json
from orchestrator.wsgi import application
from django.db import connection

def request():
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/v1/dags", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80",
               "HTTP_HOST": "127.0.0.1", "HTTP_AUTHORIZATION": "Bearer not-a-token", "wsgi.input": io.BytesIO(),
               "wsgi.url_scheme": "http", "wsgi.errors": io.StringIO()}
    statuses = []
    response = application(environ, lambda status, headers: statuses.append(status))
    b"".join(response)
    response.close()  # what the server does at the end: Django's request_finished
    return statuses[0], id(connection.connection) if connection.connection is not None else None

first, second = request(), request()
print(json.dumps({"statuses": [first[0], second[0]], "kept": [first[1], second[1]]}))
"""


def _run(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def web_env(process_env):
    return {**process_env, "DEBUG": "0", "SECRET_KEY": process_env.get("SECRET_KEY") or "test-only", "DJANGO_SETTINGS_MODULE": "orchestrator.settings"}


def test_two_requests_share_one_database_connection(web_env):
    result = _run(web_env)
    assert [s.split()[0] for s in result["statuses"]] == ["401", "401"]
    first, second = result["kept"]
    assert first is not None, "the connection was closed at the end of the request"
    assert first == second


def test_a_conn_max_age_in_database_url_still_decides(web_env):
    separator = "&" if "?" in web_env["DATABASE_URL"] else "?"
    result = _run({**web_env, "DATABASE_URL": web_env["DATABASE_URL"] + f"{separator}conn_max_age=0"})
    assert [s.split()[0] for s in result["statuses"]] == ["401", "401"]
    assert result["kept"] == [None, None]
