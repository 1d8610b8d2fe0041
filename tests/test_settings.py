"""Settings come from the environment, strictly: a bad value stops every process at start-up.

Each case imports the settings in a fresh interpreter, as a process started with that
environment would.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SHOW = """
import json, django
from django.conf import settings
django.setup()
names = {names!r}
print(json.dumps({{name: getattr(settings, name) for name in names}}, default=str))
"""


def _settings_process(names: list[str], **env: str | None) -> subprocess.CompletedProcess[str]:
    """Import the settings with `env` layered over a clean environment (None removes a variable)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    child_env["DJANGO_SETTINGS_MODULE"] = "orchestrator.settings"
    for key, value in env.items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    return subprocess.run(
        [sys.executable, "-c", SHOW.format(names=names)], env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _settings(*names: str, **env: str | None) -> dict:
    result = _settings_process(list(names), **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ORCHESTRATOR_HEARTBEAT_TIMEOUT", "garbage"),
        ("ORCHESTRATOR_HEARTBEAT_TIMEOUT", "30s"),
        ("ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET", "five"),
        ("ORCHESTRATOR_WORKER_SHUTDOWN_GRACE", "1.5.2"),
        ("DEBUG", "maybe"),
        ("ORCHESTRATOR_WORKER_HEALTH_PORT", "8001x"),
        ("ORCHESTRATOR_WORKER_HEALTH_PORT", "0"),
        ("ORCHESTRATOR_WORKER_HEALTH_PORT", "65536"),
        ("ORCHESTRATOR_BASE_URL", "orchestrator.example.com"),
        ("ORCHESTRATOR_BASE_URL", "ftp://orchestrator.example.com"),
        ("ORCHESTRATOR_BASE_URL", "https://user:password@orchestrator.example.com"),
        ("ORCHESTRATOR_BASE_URL", "https://orchestrator.example.com/?next=evil"),
        ("ORCHESTRATOR_BASE_URL", "https://orchestrator example.com"),
    ],
)
def test_it_refuses_a_malformed_value(name, value):
    """A number that is not a plain number, or a boolean that is not one, fails at start-up naming the variable and the value."""
    result = _settings_process(["DEBUG"], **{name: value})
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in last_line, result.stderr
    assert name in last_line, last_line
    assert repr(value) in last_line, last_line


def test_it_uses_sqlite_tuned_for_several_processes_without_database_url():
    """No DATABASE_URL: a SQLite file in var/ with WAL, a busy timeout and IMMEDIATE transactions."""
    database = _settings("DATABASES", DATABASE_URL=None)["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.sqlite3"
    assert Path(database["NAME"]) == ROOT / "var" / "orchestrator.sqlite3"
    assert database["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert database["OPTIONS"]["timeout"] >= 5
    assert "journal_mode=WAL" in database["OPTIONS"]["init_command"]


def test_it_opens_sqlite_in_wal_mode(tmp_path):
    """A real connection to a SQLite database really is in WAL mode."""
    code = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('PRAGMA journal_mode'); print(c.fetchone()[0])\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "orchestrator.settings", "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "wal"


def test_it_uses_the_database_and_redis_urls_it_is_given():
    """DATABASE_URL picks PostgreSQL and REDIS_URL feeds the RQ queues."""
    values = _settings(
        "DATABASES", "RQ_QUEUES",
        DATABASE_URL="postgres://orch@db.example:5433/orchestrator", REDIS_URL="redis://cache.example:6380/2",
    )
    database = values["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert (database["HOST"], database["PORT"], database["NAME"]) == ("db.example", 5433, "orchestrator")
    assert values["RQ_QUEUES"]["default"]["URL"] == "redis://cache.example:6380/2"


def test_it_has_the_documented_defaults():
    """With nothing set, every retry and timing setting has the documented default."""
    values = _settings(
        "ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET", "ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY",
        "ORCHESTRATOR_PRE_EXECUTION_RETRIES", "ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS",
        "ORCHESTRATOR_HEARTBEAT_INTERVAL", "ORCHESTRATOR_HEARTBEAT_TIMEOUT", "ORCHESTRATOR_QUEUED_TIMEOUT",
        "ORCHESTRATOR_KILL_GRACE", "ORCHESTRATOR_DEADLINE_CHECK_INTERVAL", "ORCHESTRATOR_WORKER_SHUTDOWN_GRACE",
        "ORCHESTRATOR_LISTENERS",
    )
    assert values == {
        "ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET": 5,
        "ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY": 10,
        "ORCHESTRATOR_PRE_EXECUTION_RETRIES": 1,
        "ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS": ["error"],
        "ORCHESTRATOR_HEARTBEAT_INTERVAL": 5,
        "ORCHESTRATOR_HEARTBEAT_TIMEOUT": 30,
        "ORCHESTRATOR_QUEUED_TIMEOUT": 600,
        "ORCHESTRATOR_KILL_GRACE": 5,
        "ORCHESTRATOR_DEADLINE_CHECK_INTERVAL": 5,
        "ORCHESTRATOR_WORKER_SHUTDOWN_GRACE": 30,
        "ORCHESTRATOR_LISTENERS": [],
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ""),
        ("", ""),
        ("https://orchestrator.example.com/", "https://orchestrator.example.com"),
        ("http://10.0.0.5:8000/console", "http://10.0.0.5:8000/console"),
    ],
)
def test_the_base_url_is_read_without_its_trailing_slash(value, expected):
    """The console's address for links sent out (an alert's url): empty by default (relative links)."""
    assert _settings("ORCHESTRATOR_BASE_URL", ORCHESTRATOR_BASE_URL=value)["ORCHESTRATOR_BASE_URL"] == expected


def test_it_reads_lists_from_comma_separated_values():
    """Excluded pre-execution reasons are trimmed and lowercased; empty means none; listeners are a list."""
    values = _settings(
        "ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS", "ORCHESTRATOR_LISTENERS",
        ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS="error, Killed", ORCHESTRATOR_LISTENERS="team.alerts,team.audit",
    )
    assert values["ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS"] == ["error", "killed"]
    assert values["ORCHESTRATOR_LISTENERS"] == ["team.alerts", "team.audit"]
    empty = _settings("ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS", ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS="")
    assert empty["ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS"] == []


@pytest.mark.parametrize(("value", "expected"), [(None, ""), ("", ""), ("none", ""), ("NONE", ""), ("/srv/output", "/srv/output")])
def test_the_output_store_is_off_unless_a_directory_is_named(value, expected):
    shown = _settings("ORCHESTRATOR_TASK_OUTPUT_DIR", "ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES", ORCHESTRATOR_TASK_OUTPUT_DIR=value)
    assert shown == {"ORCHESTRATOR_TASK_OUTPUT_DIR": expected, "ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES": 64 * 1024 * 1024}


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("", None), (" 8001 ", 8001)])
def test_the_worker_health_port_is_off_unless_one_is_named(value, expected):
    assert _settings("ORCHESTRATOR_WORKER_HEALTH_PORT", ORCHESTRATOR_WORKER_HEALTH_PORT=value) == {"ORCHESTRATOR_WORKER_HEALTH_PORT": expected}


def test_it_refuses_an_output_cap_that_is_not_a_number():
    result = _settings_process(["DEBUG"], ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES="64MiB")
    assert result.returncode != 0
    assert "ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("value", "threshold"), [(None, 2**31 - 1), ("true", 2**31 - 1), ("false", None)])
def test_postgresql_prepares_only_what_the_engine_asks_for_unless_turned_off(value, threshold):
    """On PostgreSQL psycopg prepares a statement only when asked (its threshold is never reached
    by repetition), and not at all when a pooling proxy in the way asks for it off; parameters
    stay bound by the client (no server_side_binding); SQLite is left alone."""
    settings = _settings(
        "DATABASES", "ORCHESTRATOR_DB_PREPARED_STATEMENTS", DATABASE_URL="postgres://orch@db.example:5433/orchestrator", ORCHESTRATOR_DB_PREPARED_STATEMENTS=value
    )
    options = settings["DATABASES"]["default"]["OPTIONS"]
    assert options.get("prepare_threshold") == threshold
    assert "server_side_binding" not in options
    assert settings["ORCHESTRATOR_DB_PREPARED_STATEMENTS"] is (threshold is not None)
    sqlite = _settings("DATABASES", DATABASE_URL=None, ORCHESTRATOR_DB_PREPARED_STATEMENTS=value)["DATABASES"]["default"]
    assert "prepare_threshold" not in sqlite.get("OPTIONS", {})


def test_it_refuses_a_prepared_statements_setting_that_is_not_a_boolean():
    result = _settings_process(["DEBUG"], ORCHESTRATOR_DB_PREPARED_STATEMENTS="sometimes")
    assert result.returncode != 0
    assert "ORCHESTRATOR_DB_PREPARED_STATEMENTS" in result.stderr.strip().splitlines()[-1]
