"""docker-compose.yml, checked as far as a machine without Docker can.

The YAML parses; every command of a service built from this project names a manage.py
command or a program the project has; every variable the app services get is one the
settings read, and is documented; the proxy's config is where the compose file mounts it;
and `manage.py check --deploy` passes with exactly the environment the web service gets.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands

from tests.conftest import ROOT

COMPOSE = ROOT / "docker-compose.yml"
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")
# What the host's .env would hold for a real deploy.
HOST_ENV = {"SECRET_KEY": secrets.token_urlsafe(50), "PUBLIC_HOST": "orchestrator.example.com"}

# Imports the settings with os.environ recording every variable read, then prints their names.
RECORD_READS = """
import json, os
read = set()
class Recorded(type(os.environ)):
    def __getitem__(self, key):
        read.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        read.add(key)
        return super().__contains__(key)
os.environ.__class__ = Recorded
import django
django.setup()
print(json.dumps(sorted(read)))
"""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(value: str, host_env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and ${VAR:?error}; $$ is a dollar."""

    def substitute(match: re.Match[str]) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        value = host_env.get(name)
        if operator == ":?" and not value:
            raise AssertionError(f"docker compose would stop: {argument}")
        if operator == ":-" and not value or operator == "-" and value is None:
            return argument
        return value or ""

    return VARIABLE.sub(substitute, value).replace("$$", "$")


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run this project's image."""
    return {name: s for name, s in compose["services"].items() if "build" in s or str(s.get("image", "")).startswith("orchestrator")}


def service_env(compose: dict[str, Any], name: str, host_env: dict[str, str]) -> dict[str, str]:
    return {key: interpolate(str(value), host_env) for key, value in compose["services"][name]["environment"].items()}


def command_words(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def problems_with(words: list[str]) -> list[str]:
    """Why a command could not run in the image: an unknown manage.py command or program."""
    if words[:2] == ["sh", "-c"]:
        return [p for part in re.split(r"&&|;|\|\|", words[2]) for p in problems_with(shlex.split(part))]
    if words[:2] == ["python", "manage.py"]:
        return [] if words[2] in get_commands() else [f"no manage.py command {words[2]!r}"]
    if words[0] == "gunicorn":
        app = words[1].split(":")[0]
        missing = [m for m in ("gunicorn", app) if importlib.util.find_spec(m) is None]
        return [f"cannot import {m}" for m in missing]
    if words[:2] == ["env", "-i"]:  # an empty environment, then a program named by its path
        return problems_with([os.path.basename(words[2]), *words[3:]]) if words[2].startswith("/usr/local/bin/") else [f"{words[2]!r} is not the image's"]
    if words[:2] == ["python", "-c"]:
        compile(words[2], "<healthcheck>", "exec")
        return []
    return [f"unknown program {words[0]!r}: teach this test what it is"]


def test_it_parses_and_has_the_expected_services(compose):
    assert {"postgres", "redis", "migrate", "web", "scheduler", "worker", "proxy"} <= set(compose["services"])


def test_every_app_command_names_something_the_project_has(compose):
    services = app_services(compose)
    assert {"migrate", "web", "scheduler", "worker"} <= set(services)
    for name, service in services.items():
        assert "command" in service, f"{name} has no command"
        commands = [command_words(service["command"])]
        check = service.get("healthcheck", {}).get("test")
        if check:
            commands.append(command_words(check)[1:] if command_words(check)[0] == "CMD" else command_words(check))
        for words in commands:
            assert problems_with(words) == [], f"service {name}: {words}"


def test_every_variable_the_app_gets_is_read_by_the_settings_and_documented(compose):
    """A misspelt variable would be ignored without a word: the settings must read each one."""
    env = {**service_env(compose, "web", HOST_ENV), "DJANGO_SETTINGS_MODULE": "orchestrator.settings"}
    result = subprocess.run(
        [sys.executable, "-c", RECORD_READS], env={**env, "PATH": os.environ["PATH"]}, cwd=ROOT,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    read = set(json.loads(result.stdout.strip().splitlines()[-1]))
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    for service in app_services(compose).values():
        for name in service.get("environment", {}):
            assert name in read, f"{name} is given to the app but the settings never read it"
            assert f"`{name}`" in configuration, f"{name} is not documented in docs/configuration.md"


def test_the_worker_runs_its_tasks_as_the_task_user_with_only_the_capabilities_that_takes(compose):
    from tests.deploy.test_helm_chart import TASK_USER_CAPABILITIES

    worker = compose["services"]["worker"]
    env = service_env(compose, "worker", HOST_ENV)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"useradd [^\n]*--uid (\d+) [^\n]*{env['ORCHESTRATOR_TASK_USER']}$", dockerfile, re.M)
    assert worker["user"] == "0:1000"  # root, to switch users; the image's group
    assert worker["cap_drop"] == ["ALL"]
    assert worker["cap_add"] == TASK_USER_CAPABILITIES
    assert worker["security_opt"] == ["no-new-privileges:true"]
    assert worker["init"] is True
    # Everything else every service gets, the worker gets too.
    assert set(service_env(compose, "web", HOST_ENV)) < set(env)
    for name, service in app_services(compose).items():
        if name != "worker":
            assert "user" not in service, name
            assert "cap_add" not in service, name  # the image's user
            assert "ORCHESTRATOR_TASK_USER" not in service_env(compose, name, HOST_ENV), name


def test_the_worker_health_check_holds_no_secret(compose):
    """It asks the worker itself over HTTP, from a process whose environment is empty."""
    worker = compose["services"]["worker"]
    port = service_env(compose, "worker", HOST_ENV)["ORCHESTRATOR_WORKER_HEALTH_PORT"]
    words = command_words(worker["healthcheck"]["test"])
    assert words[:3] == ["CMD", "env", "-i"]
    assert f"http://127.0.0.1:{port}/livez" in words[-1]


def test_every_host_variable_of_the_compose_file_is_documented(compose):
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    for name in set(VARIABLE.findall(COMPOSE.read_text())):
        assert f"`{name[0]}`" in configuration, f"${{{name[0]}}} is not documented in docs/configuration.md"


def test_the_proxy_terminates_tls_in_front_of_the_web_service(compose):
    """The Caddyfile the proxy mounts exists and passes requests to the port gunicorn binds."""
    proxy = compose["services"]["proxy"]
    mounts = {target.split(":")[0]: source for source, target in (v.split(":", 1) for v in proxy["volumes"])}
    caddyfile = ROOT / mounts["/etc/caddy/Caddyfile"]
    assert caddyfile.is_file()
    words = command_words(compose["services"]["web"]["command"])
    bind = words[words.index("-b") + 1]
    assert f"reverse_proxy web:{bind.rsplit(':', 1)[1]}" in caddyfile.read_text()
    assert {"80", "443"} <= {p.split(":")[-1].split("/")[0] for p in proxy["ports"]}
    assert "ports" not in compose["services"]["web"], "the app trusts X-Forwarded-Proto: only the proxy may reach it"


def test_every_bind_mounted_file_exists(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"service {name} mounts missing {source}"


def test_django_deploy_check_passes_with_the_web_service_environment(compose):
    """`manage.py check --deploy` with nothing but what compose gives the web container."""
    env = service_env(compose, "web", HOST_ENV)
    env.update(DJANGO_SETTINGS_MODULE="orchestrator.settings", PATH=os.environ["PATH"], HOME=str(Path.home()))
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_deploy_check_would_catch_a_plain_http_setup(compose):
    """The same check fails when HTTPS is switched off: the test above is not vacuous."""
    env = service_env(compose, "web", HOST_ENV)
    env.update(
        DJANGO_SETTINGS_MODULE="orchestrator.settings", PATH=os.environ["PATH"], HOME=str(Path.home()),
        SECURE_SSL_REDIRECT="false", SESSION_COOKIE_SECURE="false",
    )  # fmt: skip
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "security.W008" in result.stderr + result.stdout
    assert "security.W012" in result.stderr + result.stdout
