"""Shared fixtures: personas, and helpers to run real workers and schedulers against the test database."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix) -> None:
    """On SQLite the test database is a file (not Django's default in-memory one), so that the
    workers and schedulers a test starts share it."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3") and not database.get("TEST", {}).get("NAME"):
        # A parallel test process (pytest-xdist's gw0, gw1, ...) has a file of its own.
        process = os.environ.get("PYTEST_XDIST_WORKER", "")
        database.setdefault("TEST", {})["NAME"] = str(Path(database["NAME"]).with_name(f"test_db{'_' + process if process else ''}.sqlite3"))


@pytest.fixture
def process_env(transactional_db) -> dict[str, str]:
    """Environment for a child process that talks to this test's database and Redis."""
    env = dict(os.environ)
    settings_dict = connection.settings_dict
    if settings_dict["ENGINE"].endswith("postgresql"):
        user = settings_dict.get("USER") or "postgres"
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        env["DATABASE_URL"] = f"postgres://{user}@{host}:{port}/{settings_dict['NAME']}"
    else:  # SQLite: the test database must be a file for other processes to see it
        env["DATABASE_URL"] = f"sqlite:///{settings_dict['NAME']}"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("ORCHESTRATOR_HEARTBEAT_INTERVAL", "0.5")
    env.setdefault("ORCHESTRATOR_HEARTBEAT_TIMEOUT", "5")
    env.setdefault("ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY", "0")
    env.setdefault("ORCHESTRATOR_KILL_GRACE", "1")
    env.setdefault("ORCHESTRATOR_WORKER_SHUTDOWN_GRACE", "2")
    return env


@pytest.fixture
def spawn(process_env) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start `manage.py <args>` as a real process; every process is killed at teardown."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env={**process_env, **(env or {})},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started in a session of its own, and all it started; reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, message: str = "") -> object:
    """Poll `predicate` until it returns a truthy value, or fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


@pytest.fixture
def empty_default_queue() -> Iterator[None]:
    """The `default` RQ queue empty before and after the test (jobs a dispatch enqueued)."""
    from rq import Queue

    from orchestrator.foundation.redis_conn import get_redis

    Queue("default", connection=get_redis()).empty()
    yield
    Queue("default", connection=get_redis()).empty()


@pytest.fixture
def caches_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What a step reads only now and then, held for the whole test: the queue-storm counts a
    dispatch reads at most once a second (`engine/storms.py`) and the database clock's offset,
    measured once a minute (`clock.py`). A test that counts a step's statements warms them with
    a first step, and on a loaded machine their time may run out before the step it counts."""
    from orchestrator.engine import storms
    from orchestrator.foundation import clock

    monkeypatch.setattr(storms, "CACHE_SECONDS", 3600.0)
    monkeypatch.setattr(clock, "OFFSET_TTL", 3600.0)
    storms.forget()
    yield
    storms.forget()


@pytest.fixture(autouse=True)
def fresh_queue_listeners() -> None:
    """Which queues live workers read is reused for up to a second (`queue_listeners`): each
    test asks Redis afresh, not a test before it."""
    from orchestrator.data import queue_listeners

    queue_listeners.forget()


@pytest.fixture(autouse=True)
def no_outage_left_behind() -> Iterator[None]:
    """A database outage a test noted in Redis, and the wait for a heartbeat timeout it turns
    into, outlive the test by up to a minute: the next test of this process would find no task
    lost until then. Removed after each test, from this process's own Redis database."""
    yield
    import redis

    from orchestrator.engine.scheduler import _Reconnection

    client = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=2, socket_connect_timeout=2)
    try:
        client.delete(_Reconnection.OUTAGE_KEY, _Reconnection.PRESUME_FROM_KEY)
    except redis.RedisError:
        pass
    finally:
        client.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The minutes-long tests first: in a parallel run one process takes each of them at the
    start while the others share the rest, instead of one of them running on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("long_outage") is None)
