"""HTTPS settings: production's defaults with DEBUG off, development's with it on, read strictly;
/healthz stays reachable over plain HTTP."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.test import Client

from tests.conftest import ROOT

NAMES = [
    "SECURE_PROXY_SSL_HEADER", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "CSRF_TRUSTED_ORIGINS",
    "SECURE_REDIRECT_EXEMPT", "DATA_UPLOAD_MAX_MEMORY_SIZE",
]  # fmt: skip
SHOW = "import json, django; from django.conf import settings; django.setup(); print(json.dumps({n: getattr(settings, n) for n in %r}))"
# What bin/test sets for the test servers must not leak into these fresh processes.
OURS = ("SECURE_", "SESSION_COOKIE_", "CSRF_", "DATA_UPLOAD_", "DEBUG")


def settings_process(**env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith(OURS)}
    child.update(DJANGO_SETTINGS_MODULE="orchestrator.settings", **env)
    return subprocess.run(
        [sys.executable, "-c", SHOW % (NAMES,)], env=child, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def read(**env: str) -> dict:
    result = settings_process(**env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_debug_off_defaults_to_secure_cookies_and_hsts_but_no_redirect():
    """TLS is the proxy's job: with DEBUG off the app still answers plain HTTP unless
    SECURE_SSL_REDIRECT=true; /healthz and /metrics are never redirected."""
    values = read(DEBUG="false")
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert values["SECURE_SSL_REDIRECT"] is False
    assert values["SESSION_COOKIE_SECURE"]
    assert values["CSRF_COOKIE_SECURE"]
    assert values["SECURE_HSTS_SECONDS"] == 31_536_000
    assert values["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert values["SECURE_HSTS_PRELOAD"] is False
    assert values["SECURE_REDIRECT_EXEMPT"] == [r"^healthz$", r"^metrics$"]
    assert values["DATA_UPLOAD_MAX_MEMORY_SIZE"] == 2_621_440


def test_debug_off_redirects_when_told_to():
    assert read(DEBUG="false", SECURE_SSL_REDIRECT="true")["SECURE_SSL_REDIRECT"] is True


def test_debug_on_defaults_to_plain_http_for_development():
    values = read(DEBUG="true")
    assert values["SECURE_PROXY_SSL_HEADER"] is None
    assert not (values["SECURE_SSL_REDIRECT"])
    assert not (values["SESSION_COOKIE_SECURE"])
    assert not (values["CSRF_COOKIE_SECURE"])
    assert values["SECURE_HSTS_SECONDS"] == 0
    assert not values["SECURE_HSTS_INCLUDE_SUBDOMAINS"]


def test_each_is_read_from_the_environment():
    values = read(
        DEBUG="false", SECURE_PROXY_SSL_HEADER="X-Forwarded-Scheme", SECURE_SSL_REDIRECT="no", SECURE_HSTS_SECONDS="3600",
        SECURE_HSTS_PRELOAD="yes", CSRF_TRUSTED_ORIGINS="https://a.example.com, https://*.b.example.com",
        DATA_UPLOAD_MAX_MEMORY_SIZE="1048576",
    )  # fmt: skip
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_SCHEME", "https"]
    assert values["SECURE_SSL_REDIRECT"] is False
    assert values["SECURE_HSTS_SECONDS"] == 3600
    assert values["SECURE_HSTS_PRELOAD"] is True
    assert values["CSRF_TRUSTED_ORIGINS"] == ["https://a.example.com", "https://*.b.example.com"]
    assert values["DATA_UPLOAD_MAX_MEMORY_SIZE"] == 1_048_576
    assert read(DEBUG="false", SECURE_PROXY_SSL_HEADER="")["SECURE_PROXY_SSL_HEADER"] is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SECURE_SSL_REDIRECT", "maybe"),
        ("SESSION_COOKIE_SECURE", "secure"),
        ("SECURE_HSTS_SECONDS", "1y"),
        ("SECURE_HSTS_SECONDS", "-1"),
        ("DATA_UPLOAD_MAX_MEMORY_SIZE", "2MB"),
        ("CSRF_TRUSTED_ORIGINS", "orchestrator.example.com"),
        ("CSRF_TRUSTED_ORIGINS", "https://orchestrator.example.com/path"),
        ("SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto: https"),
    ],
)
def test_a_malformed_value_stops_start_up_naming_it(name, value):
    result = settings_process(DEBUG="false", **{name: value})
    assert result.returncode != 0
    assert name in result.stderr
    assert "ImproperlyConfigured" in result.stderr


@pytest.fixture
def https_only(settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600


def test_healthz_and_metrics_answer_plain_http_while_everything_else_is_redirected(https_only, db):
    client = Client()
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 401  # answered (a scrape needs a token), not redirected
    for path in ("/api/v1/dags", "/"):
        redirected = client.get(path)
        assert redirected.status_code == 301
        assert redirected["Location"].startswith("https://")


def test_plain_http_is_served_by_a_server_with_debug_off_by_default(tmp_path, process_env):
    """A real server process with DEBUG off and the production settings but no
    SECURE_SSL_REDIRECT: plain HTTP requests are answered, not sent to HTTPS."""
    import socket
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in process_env.items() if not k.startswith(OURS)}
    env.update(DEBUG="false", ALLOWED_HOSTS="127.0.0.1", SECRET_KEY="x" * 60, DJANGO_SETTINGS_MODULE="orchestrator.settings")
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", "--insecure", f"127.0.0.1:{port}"],
        env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)

    def status(path: str) -> int:
        try:
            return opener.open(f"http://127.0.0.1:{port}{path}", timeout=5).status
        except urllib.error.HTTPError as error:
            return error.code

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                first = status("/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail(f"the server did not answer: {log.read_text()}")
                time.sleep(0.2)
        assert first == 200
        assert status("/metrics") == 401
        assert status("/api/v1/dags") == 401
        assert status("/") == 302  # to the login page, over plain HTTP
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_request_the_proxy_marks_https_is_served(https_only, db):
    response = Client().get("/api/v1/dags", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 401  # served (and refused for want of a login), not redirected
    assert response["Strict-Transport-Security"].startswith("max-age=3600")
