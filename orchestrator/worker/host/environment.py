"""What a task process's environment holds, and what its fork server's does. Pure.

A task runs under the worker's user, forked from (or, for bash, started by) the worker's fork
server, so it can read that server's `/proc/<pid>/environ` and, when forked, everything in its
memory. The fork server therefore holds nothing a task may not see: the task environment, plus
the platform settings it needs to run tasks (ORCHESTRATOR_*), plus the database's and Redis's
addresses *without their passwords* (a task that uses Django's models reaches the database only
where it is let in without one) and a throwaway SECRET_KEY. Those extras reach it over its
socket, not in the environment it is started with: a forked task's `/proc/self/environ` is that
start-up environment, which a task reads whatever its `os.environ` says.
"""
from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

# The platform's own connection strings, keys and passwords: a task has no business with them.
PLATFORM_SECRETS = frozenset({"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "EMAIL_URL", "PGPASSWORD"})
# Every platform setting is the platform's: none is the task's to read.
PLATFORM_PREFIX = "ORCHESTRATOR_"
# Addresses the fork server keeps, with any password taken out.
ADDRESSES = ("DATABASE_URL", "REDIS_URL")


def task_environment(worker_environment: Mapping[str, str], passthrough: Iterable[str] = (), deny: Iterable[str] = ()) -> dict[str, str]:
    """The worker's environment minus DATABASE_URL, REDIS_URL, SECRET_KEY, EMAIL_URL,
    PGPASSWORD and every ORCHESTRATOR_* setting, except the names listed in `passthrough`
    (ORCHESTRATOR_TASK_ENV_PASSTHROUGH), and minus every name in `deny`
    (ORCHESTRATOR_TASK_ENV_DENY), which no passthrough lets in. The task's own context
    variables (ORCHESTRATOR_DAG_ID and friends) are added later by the task process itself."""
    allowed = set(passthrough) - set(deny)
    denied = set(deny)
    return {
        name: value
        for name, value in worker_environment.items()
        if name not in denied and (name in allowed or not (name in PLATFORM_SECRETS or name.startswith(PLATFORM_PREFIX)))
    }


def fork_server_environment(
    worker_environment: Mapping[str, str], passthrough: Iterable[str] = (), secret_key: str | None = None, deny: Iterable[str] = ()
) -> dict[str, str]:
    """The fork server's environment: what its tasks may see, its ORCHESTRATOR_* settings, the
    database's and Redis's URLs without passwords, and a SECRET_KEY of its own that signs
    nothing (so the platform's key is not even read from disk)."""
    env = task_environment(worker_environment, passthrough, deny)
    allowed = set(passthrough) - set(deny)
    for name, value in worker_environment.items():
        if name.startswith(PLATFORM_PREFIX):
            env[name] = value
    for name in ADDRESSES:
        if name in worker_environment and name not in allowed:
            env[name] = without_password(worker_environment[name])
    if "SECRET_KEY" not in allowed:
        env["SECRET_KEY"] = secret_key or f"task-processes-sign-nothing-{secrets.token_hex(16)}"
    return env


def without_password(url: str) -> str:
    """`scheme://user:password@host/...` -> `scheme://user@host/...`; the query's password too."""
    parts = urlsplit(url)
    if "@" not in parts.netloc and "password=" not in parts.query.lower():
        return url  # nothing to take out (and sqlite:////path stays as written)
    netloc = parts.netloc
    if "@" in netloc:
        credentials, host = netloc.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        netloc = f"{user}@{host}" if user else host
    query = "&".join(p for p in parts.query.split("&") if p and not p.lower().startswith("password="))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def fork_server_settings(worker_environment: Mapping[str, str], passthrough: Iterable[str] = (), deny: Iterable[str] = ()) -> dict[str, str]:
    """What the fork server's environment holds beyond the task environment it is started with:
    sent to it at start, never in its (or a forked task's) `/proc/PID/environ`."""
    tasks_see = task_environment(worker_environment, passthrough, deny)
    full = fork_server_environment(worker_environment, passthrough, deny=deny)
    return {name: value for name, value in full.items() if tasks_see.get(name) != value}
