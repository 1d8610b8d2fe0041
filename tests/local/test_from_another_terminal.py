"""A new user's first minutes, with real processes: `run_local` (what `make run` runs) from a
fresh copy of the repository, then the README's "Try it" commands from a second terminal.

Neither process has DATABASE_URL or REDIS_URL: the second one must find the stack by itself,
and with the stack down must say so in one line, not wait for a Redis that is not there.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from orchestrator.local import stack_file
from orchestrator.local.embedded_redis import free_port
from tests.local.stack import Stack, commands, get, readme_block, readme_path_setup, readme_try_it, shell

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def stack(checkout) -> Iterator[Stack]:
    running = Stack(checkout, free_port())
    try:
        running.wait_for_banner()
        yield running
    finally:
        running.stop()


def _not_running(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 1, result
    assert result.stderr == f"error: {stack_file.NOT_RUNNING}\n"
    assert result.stdout == ""


def test_the_readme_commands_reach_the_running_stack_and_the_flaky_example_ends_in_seconds(checkout, stack):
    trigger, status, status_json = readme_try_it(checkout)
    assert trigger.endswith("trigger_dag example_flaky --wait")
    assert status_json.endswith("--json")

    started = time.monotonic()
    result = shell(checkout, trigger, timeout=30)
    assert result.returncode == 0, (result, stack.output)
    assert time.monotonic() - started < 20  # seconds, not the 600 s of a lost job
    lines = result.stdout.splitlines()
    run_id = lines[0]
    assert run_id.startswith("manual__")
    assert lines[-1] == "success"
    progress = lines[1:-1]
    assert progress, lines
    assert all(line.startswith("tasks: ") for line in progress), lines  # one plain line per change
    assert progress[-1] == "tasks: 2/2 done, 0 running, 0 failed; run: success"

    summary = shell(checkout, status)
    assert summary.returncode == 0, summary
    assert f"example_flaky {run_id}: success" in summary.stdout
    assert re.search(r"flaky\s+success\s+try 2/3 ", summary.stdout), summary.stdout

    document = shell(checkout, status_json)
    assert document.returncode == 0, document
    run = json.loads(document.stdout)
    assert run["run_id"] == run_id
    assert run["state"] == "success"
    flaky = next(ti for ti in run["task_instances"] if ti["task_id"] == "flaky")
    assert (flaky["try_number"], flaky["max_tries"], flaky["state"]) == (2, 3, "success")
    reasons = [(a["context"] or {}).get("reason") for ti in run["task_instances"] for a in ti["attempts"]]
    assert "queue_lost" not in reasons, reasons
    assert reasons.count("task_exception") == 1, reasons


def test_the_readme_dead_letter_example_is_dead_lettered(checkout, stack):
    """The opt-in poison_threshold, exactly as the README shows it: per DAG, overridden per task."""
    (checkout / "poison_demo.yaml").write_text(readme_block(checkout, "Dead letters", "yaml"))
    load, trigger = (f"{readme_path_setup(checkout)}; {command}" for command in commands(readme_block(checkout, "Dead letters", "sh")))
    loaded = shell(checkout, load)
    assert loaded.returncode == 0, loaded
    result = shell(checkout, trigger, timeout=60)
    assert result.returncode == 3, (result, stack.output)
    assert result.stdout.splitlines()[-1] == "dead_letter"
    run = json.loads(shell(checkout, ".venv/bin/python manage.py run_status poison_demo latest --json").stdout)
    broken = run["task_instances"][0]
    assert (broken["state"], broken["try_number"], broken["max_tries"]) == ("dead_letter", 3, 6)
    assert broken["last_failure_context"]["reason"] == "poisoned"


def test_the_banner_comes_last_and_debug_is_on_for_a_loopback_host(checkout, stack):
    banner = next(i for i, line in enumerate(stack.lines) if "Orchestrator is running at" in line)
    before = "\n".join(stack.lines[:banner])
    assert "Quit the server with CONTROL-C." in before, stack.output
    assert '"GET /healthz' in before, stack.output
    assert "DEBUG on" in before
    time.sleep(1)
    after = [line for line in stack.lines[banner:] if "| " in line]
    assert after == [], after  # no server line comes after the banner while nothing happens
    base = re.search(r"running at (\S+)", stack.lines[banner]).group(1)
    status, page = get(base + "no-such-page/")
    assert status == 404
    assert "Using the URLconf defined in" in page


def test_with_the_stack_down_a_command_says_so_in_one_line_and_uses_no_other_redis(checkout):
    runtime_path = stack_file.runtime_file(checkout / "var")
    stack = Stack(checkout, free_port())
    try:
        stack.wait_for_banner()
        assert runtime_path.exists()
    finally:
        assert stack.stop() == 0, stack.output
    assert not runtime_path.exists()

    trigger = readme_try_it(checkout)[0]
    _not_running(shell(checkout, trigger, timeout=10))
    _not_running(shell(checkout, ".venv/bin/python manage.py run_worker", timeout=10))
    _not_running(shell(checkout, ".venv/bin/python manage.py run_scheduler --once", timeout=10))
    _not_running(shell(checkout, f".venv/bin/python manage.py runserver 127.0.0.1:{free_port()}", timeout=10))


def test_a_stack_that_was_killed_outright_is_not_used(checkout):
    """SIGKILL leaves the runtime file behind; its dead owner makes it ignored."""
    runtime_path = stack_file.runtime_file(checkout / "var")
    stack = Stack(checkout, free_port())
    try:
        stack.wait_for_banner()
        stack.kill_outright()
        assert runtime_path.exists()
        _not_running(shell(checkout, readme_try_it(checkout)[0], timeout=10))
    finally:
        stack.stop()  # its children and Redis got SIGTERM when it died: this waits for them to exit


def test_a_second_stack_on_the_same_checkout_is_refused(checkout, stack):
    second = Stack(checkout, free_port())
    try:
        assert second.process.wait(30) == 1
        second.reader.join(5)
        assert "the local stack is already running (pid" in second.output
    finally:
        second.stop()


def test_host_0_0_0_0_turns_debug_off_and_serves_the_allowed_host(checkout):
    """`make run HOST=0.0.0.0 ALLOWED_HOSTS=myhost`: reachable from other machines, so no debug pages."""
    port = free_port()
    stack = Stack(checkout, port, "--host", "0.0.0.0", ALLOWED_HOSTS="myhost")
    try:
        stack.wait_for_banner()
        assert f"Orchestrator is running at http://myhost:{port}/" in stack.output
        assert "DEBUG off" in stack.output
        status, page = get(f"http://127.0.0.1:{port}/no-such-page/", host="myhost")
        assert status == 404
        assert "Using the URLconf defined in" not in page
    finally:
        stack.stop()
