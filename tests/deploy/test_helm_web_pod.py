"""The chart's web pod, run as its two containers would: the rendered Caddyfile in front of
gunicorn started with the web container's own command line and environment (the Secret's keys
filled with this test's database and Redis). What a user behind the Ingress gets: static files
from the proxy, HTTPS redirects only for plain HTTP, no redirect loop behind TLS, /healthz
always plain."""
from __future__ import annotations

import http.client
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, wait_until
from tests.deploy.test_helm_chart import PRODUCTION, of_kind, render

HOST = "orchestrator.example.com"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        connection.request("GET", path, headers={"Host": HOST, **(headers or {})})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def answers(port: int) -> bool:
    try:
        return get(port, "/healthz")[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def web_pod(tmp_path_factory) -> Iterator[int]:
    """Started once for the module. The pages it is asked for need neither the database nor
    Redis (the login redirect, /healthz, static files), so the run's own URLs do."""
    tmp_path = tmp_path_factory.mktemp("web-pod")
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("caddy is not installed (Debian's caddy package)")
    objects = render(PRODUCTION)
    (deployment,) = [o for o in of_kind(objects, "Deployment") if o["metadata"]["name"].endswith("-web")]
    containers: dict[str, Any] = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    (config,) = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-web-proxy")]

    gunicorn_port, proxy_port = free_port(), free_port()
    secret = {"DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": os.environ["REDIS_URL"], "SECRET_KEY": secrets.token_urlsafe(50)}
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    for item in containers["web"]["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item["name"] in secret:
            env[item["name"]] = secret[item["name"]]
    command = [c.replace("0.0.0.0:8000", f"127.0.0.1:{gunicorn_port}") for c in containers["web"]["command"]]
    command[0] = str(Path(sys.executable).parent / "gunicorn")  # the one installed beside this Python

    static = tmp_path / "static"
    (static / "orchestrator").mkdir(parents=True)
    (static / "orchestrator" / "probe.css").write_text("body { color: teal }\n")
    caddyfile = (
        config["data"]["Caddyfile"]
        .replace(":8080 {", f":{proxy_port} {{")
        .replace("127.0.0.1:8000", f"127.0.0.1:{gunicorn_port}")
        .replace("root * /static", f"root * {static}")
    )
    (tmp_path / "Caddyfile").write_text(caddyfile)
    proxy_env = {"PATH": os.environ["PATH"], "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}

    procs = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True),
        subprocess.Popen(
            [caddy, "run", "--config", str(tmp_path / "Caddyfile"), "--adapter", "caddyfile"],
            env=proxy_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        ),
    ]
    try:
        wait_until(lambda: answers(proxy_port), timeout=60, interval=0.3, message="the web pod to answer through its proxy")
        yield proxy_port
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_static_files_come_from_the_proxy(web_pod):
    status, headers, body = get(web_pod, "/static/orchestrator/probe.css", {"X-Forwarded-Proto": "https"})
    assert status == 200
    assert body == b"body { color: teal }\n"
    assert "max-age=3600" in headers["cache-control"]
    assert "server" not in headers


def test_behind_tls_the_app_answers_without_redirecting_again(web_pod):
    status, headers, _ = get(web_pod, "/", {"X-Forwarded-Proto": "https"})
    assert status == 302
    assert headers["location"].startswith("/accounts/login/")


def test_plain_http_is_sent_to_https_but_healthz_is_not(web_pod):
    status, headers, _ = get(web_pod, "/")
    assert status == 301
    assert headers["location"] == f"https://{HOST}/"
    status, _, body = get(web_pod, "/healthz")
    assert status == 200
    assert b'"ok"' in body
