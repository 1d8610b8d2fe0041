"""The runtime file through which commands in another terminal find the local stack, and
the runner's DEBUG default. Pure file and process checks: no database, no Redis."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.local import stack_file
from orchestrator.local.stack import child_debug

STACK_DB = "sqlite:////somewhere/var/orchestrator.sqlite3"
STACK_REDIS = "redis://127.0.0.1:45678/0"
TRIGGER = ["manage.py", "trigger_dag", "example_flaky", "--wait"]


def _write_ours(var_dir: Path) -> stack_file.StackInfo:
    info = stack_file.info_for_this_process(STACK_DB, STACK_REDIS, "http://127.0.0.1:8000/")
    stack_file.write(stack_file.runtime_file(var_dir), info)
    return info


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_live_stack_gives_its_database_and_redis_to_a_command_with_neither_set(tmp_path):
    _write_ours(tmp_path)
    stack = stack_file.stack_for(TRIGGER, {}, tmp_path)
    assert stack is not None
    assert stack.pid == os.getpid()
    assert stack_file.database_url({}, stack, tmp_path) == STACK_DB
    assert stack_file.redis_url({}, stack) == STACK_REDIS


def test_the_file_is_private_and_written_whole(tmp_path):
    """Mode 0600 (URLs may hold passwords), and no draft is left beside it."""
    _write_ours(tmp_path)
    path = stack_file.runtime_file(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["redis_url"] == STACK_REDIS
    assert [p.name for p in tmp_path.iterdir()] == [stack_file.FILE_NAME]


def test_explicit_urls_always_win(tmp_path):
    _write_ours(tmp_path)
    both = {"DATABASE_URL": "postgres://db.example/orch", "REDIS_URL": "redis://cache.example:6380/2"}
    assert stack_file.stack_for(TRIGGER, both, tmp_path) is None

    only_redis = {"REDIS_URL": "redis://cache.example:6380/2"}
    stack = stack_file.stack_for(TRIGGER, only_redis, tmp_path)
    assert stack_file.redis_url(only_redis, stack) == "redis://cache.example:6380/2"
    assert stack_file.database_url(only_redis, stack, tmp_path) == STACK_DB

    only_db = {"DATABASE_URL": "postgres://db.example/orch"}
    stack = stack_file.stack_for(TRIGGER, only_db, tmp_path)
    assert stack_file.database_url(only_db, stack, tmp_path) == "postgres://db.example/orch"
    assert stack_file.redis_url(only_db, stack) == STACK_REDIS


def test_a_file_whose_owner_is_dead_is_ignored(tmp_path):
    """The runner was killed outright: the file stays, but nobody uses it."""
    stale = stack_file.StackInfo(_dead_pid(), "12345", STACK_DB, STACK_REDIS, "http://127.0.0.1:8000/")
    stack_file.write(stack_file.runtime_file(tmp_path), stale)
    assert stack_file.stack_for(TRIGGER, {}, tmp_path) is None
    assert stack_file.database_url({}, None, tmp_path) == stack_file.default_database_url(tmp_path)
    assert stack_file.redis_url({}, None) == stack_file.NO_REDIS_URL


def test_a_reused_pid_does_not_pass_for_the_owner(tmp_path):
    """A live process with the recorded pid but another start time is not the runner."""
    recycled = stack_file.StackInfo(os.getpid(), "1", STACK_DB, STACK_REDIS, "")
    stack_file.write(stack_file.runtime_file(tmp_path), recycled)
    assert stack_file.read_live(stack_file.runtime_file(tmp_path)) is None


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"pid": "x"}', '{"pid": 1}'])
def test_a_malformed_file_is_ignored(tmp_path, content):
    stack_file.runtime_file(tmp_path).write_text(content)
    assert stack_file.stack_for(TRIGGER, {}, tmp_path) is None


def test_no_file_means_no_stack_and_never_a_default_redis(tmp_path):
    assert stack_file.stack_for(TRIGGER, {}, tmp_path) is None
    assert stack_file.redis_url({}, None) == stack_file.NO_REDIS_URL
    assert "6379" not in stack_file.NO_REDIS_URL


def test_the_runner_never_uses_another_stacks_file(tmp_path):
    _write_ours(tmp_path)
    assert stack_file.stack_for(["manage.py", "run_local", "--port", "8001"], {}, tmp_path) is None


def test_only_the_owner_removes_the_file(tmp_path):
    path = stack_file.runtime_file(tmp_path)
    stack_file.write(path, stack_file.StackInfo(_dead_pid(), "1", STACK_DB, STACK_REDIS, ""))
    stack_file.remove_if_ours(path)
    assert path.exists()
    _write_ours(tmp_path)
    stack_file.remove_if_ours(path)
    assert not path.exists()


@pytest.mark.parametrize(
    ("argv", "needs"),
    [
        (TRIGGER, True),
        (["manage.py", "run_worker"], True),
        (["manage.py", "run_scheduler", "--once"], True),
        (["manage.py", "trigger_dag", "--help"], False),
        (["manage.py", "run_status", "example_flaky", "latest"], False),
        (["manage.py", "migrate"], False),
        (["manage.py"], False),
    ],
)
def test_it_knows_which_commands_need_redis(argv, needs):
    assert stack_file.needs_redis(argv) is needs


def test_a_command_that_needs_redis_stops_with_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        stack_file.stop_if_redis_missing(TRIGGER, stack_file.NO_REDIS_URL)
    assert stopped.value.code == 1
    assert capsys.readouterr().err == f"error: {stack_file.NOT_RUNNING}\n"
    stack_file.stop_if_redis_missing(TRIGGER, STACK_REDIS)  # configured: goes on
    stack_file.stop_if_redis_missing(["manage.py", "migrate"], stack_file.NO_REDIS_URL)  # needs no Redis


@pytest.mark.parametrize(
    ("host", "environ", "debug"),
    [
        ("127.0.0.1", {}, "1"),
        ("localhost", {}, "1"),
        ("0.0.0.0", {}, "0"),
        ("192.168.1.20", {}, "0"),
        ("0.0.0.0", {"DEBUG": "1"}, "1"),
        ("127.0.0.1", {"DEBUG": "0"}, "0"),
    ],
)
def test_debug_is_on_only_for_a_loopback_host_unless_set(host, environ, debug):
    assert child_debug(host, environ) == debug
