"""What a task's environment and its fork server's hold: pure rules."""
from __future__ import annotations

from orchestrator.worker.host.environment import fork_server_environment, fork_server_settings, task_environment, without_password

WORKER = {
    "PATH": "/usr/bin",
    "DATABASE_URL": "postgres://orch:s3cret@db:5432/orch?sslmode=require",
    "REDIS_URL": "redis://:r3dis@redis:6379/0",
    "SECRET_KEY": "django-secret",
    "EMAIL_URL": "smtp://u:p@mail",
    "PGPASSWORD": "pg-secret",
    "ORCHESTRATOR_FAILPOINTS": "task.before_running=exit:3",
    "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
}


def test_a_task_sees_no_platform_setting_and_no_secret():
    env = task_environment(WORKER)
    assert env == {"PATH": "/usr/bin", "DJANGO_SETTINGS_MODULE": "orchestrator.settings"}


def test_the_fork_server_keeps_addresses_and_settings_but_no_password_or_key():
    env = fork_server_environment(WORKER, secret_key="throwaway")
    assert env["DATABASE_URL"] == "postgres://orch@db:5432/orch?sslmode=require"
    assert env["REDIS_URL"] == "redis://redis:6379/0"
    assert env["SECRET_KEY"] == "throwaway"
    assert env["ORCHESTRATOR_FAILPOINTS"] == "task.before_running=exit:3"
    assert "EMAIL_URL" not in env
    assert "PGPASSWORD" not in env
    for secret in ("s3cret", "r3dis", "django-secret", "pg-secret", "smtp://u:p@mail"):
        assert all(secret not in value for value in env.values())


def test_the_fork_server_is_started_with_the_task_environment_and_sent_the_rest():
    started_with, sent = task_environment(WORKER), fork_server_settings(WORKER)
    assert {**started_with, **sent}.keys() == fork_server_environment(WORKER).keys()
    assert set(sent) == {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ORCHESTRATOR_FAILPOINTS"}
    assert sent["DATABASE_URL"] == "postgres://orch@db:5432/orch?sslmode=require"
    assert not set(sent) & set(started_with)


def test_what_is_passed_through_on_purpose_stays_whole():
    env = fork_server_environment(WORKER, passthrough=["DATABASE_URL", "SECRET_KEY"])
    assert env["DATABASE_URL"] == WORKER["DATABASE_URL"]
    assert env["SECRET_KEY"] == "django-secret"


def test_without_password_leaves_urls_without_one_as_written():
    assert without_password("sqlite:////var/db.sqlite3") == "sqlite:////var/db.sqlite3"
    assert without_password("redis://127.0.0.1:6379/1") == "redis://127.0.0.1:6379/1"
    assert without_password("postgres://u@h/db?password=x&sslmode=require") == "postgres://u@h/db?sslmode=require"
