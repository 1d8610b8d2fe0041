"""A new user's first minutes, with real processes: `run_local` (what `make run` runs) from a
fresh copy of the repository, then the README's "Try it" commands from a second terminal.

Neither process has DATABASE_URL or REDIS_URL: the second one must find the stack by itself,
and with the stack down must say so in one line, not wait for a Redis that is not there.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.local import runtime
from orchestrator.local.embedded_redis import free_port
from tests.conftest import ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Fast loops, so that the flaky example ends in seconds.
FAST = {
    "ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2",
    "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.5",
    "ORCHESTRATOR_WORKER_SHUTDOWN_GRACE": "2",
    "ORCHESTRATOR_KILL_GRACE": "1",
}
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "var", "staticfiles", "__pycache__", ".pytest_cache", ".hypothesis")


def _repository_files(root: Path) -> list[str] | None:
    """The files a clone would have: tracked ones, and new ones not ignored (None without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root, capture_output=True, check=True, timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [name for name in listed.decode().split("\0") if name and (root / name).is_file()]


def fresh_copy(destination: Path) -> Path:
    """The repository as a fresh clone has it, with the test's virtualenv as its `.venv`."""
    files = _repository_files(ROOT)
    if files is None:
        shutil.copytree(ROOT, destination, ignore=COPY_IGNORE)
    else:
        for name in files:
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
    (destination / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return destination


def clean_env(checkout: Path, **extra: str) -> dict[str, str]:
    """A user's shell: no DATABASE_URL, REDIS_URL, DEBUG or settings of ours; the checkout's code first."""
    dropped = {"DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("ORCHESTRATOR_")}
    env["PYTHONPATH"] = str(checkout)  # the venv's editable install points at the original checkout
    env.update(FAST, **extra)
    return env


class Stack:
    """`manage.py run_local` in the copy, its output collected as it comes."""

    def __init__(self, checkout: Path, port: int, *args: str, **env: str) -> None:
        self.checkout = checkout
        self.process = subprocess.Popen(
            [str(checkout / ".venv" / "bin" / "python"), "manage.py", "run_local", "--port", str(port), *args],
            cwd=checkout, env=clean_env(checkout, **env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        self.family: set[int] = set()
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_banner(self) -> None:
        wait_until(lambda: "Press Ctrl-C to stop." in self.output or self.process.poll() is not None, timeout=60, message="the banner")
        assert self.process.poll() is None, self.output

    def descendants(self) -> set[int]:
        """The runner's live process tree: web, scheduler, workers, their tasks, Redis."""
        parents = {pid: parent for pid, parent, _ in _processes()}
        found: set[int] = set()
        frontier = {self.process.pid}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
            found |= frontier
        return found

    def kill_outright(self) -> None:
        """SIGKILL the runner alone, as a closed terminal or the OOM killer would."""
        self.family |= self.descendants()
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> int | None:
        """SIGTERM and its grace, then SIGKILL: nothing of this stack outlives the test."""
        self.family |= self.descendants()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)
        self.reader.join(5)
        self._reap(self.family)
        return self.process.returncode

    @staticmethod
    def _reap(pids: set[int], grace: float = 20.0) -> None:
        """Children run in sessions of their own and get SIGTERM when the runner dies; give
        them their shutdown grace, then SIGKILL whatever is left."""
        def alive() -> set[int]:
            return {pid for pid, _, zombie in _processes() if pid in pids and not zombie}

        deadline = time.monotonic() + grace
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _processes() -> list[tuple[int, int, bool]]:
    """(pid, parent pid, is a zombie) of every process, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found.append((int(entry.name), int(fields[1]), fields[0] == "Z"))
    return found


def shell(checkout: Path, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A command typed in a second terminal of the checkout (stdout is a pipe, not a terminal)."""
    return subprocess.run(
        ["sh", "-c", command], cwd=checkout, env=clean_env(checkout), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout,
    )


def readme_block(checkout: Path, heading: str, language: str) -> str:
    """The first code block in `language` of the README's section `heading`."""
    section = (checkout / "README.md").read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def commands(block: str) -> list[str]:
    """The commands of a shell block, without their comments."""
    return [re.split(r"\s+#", line)[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def readme_path_setup(checkout: Path) -> str:
    """The line of "Try it" that puts the `orchestrator` command on the PATH: every later
    example of the README assumes it, as a user's terminal would have it."""
    setup = commands(readme_block(checkout, "Try it", "sh"))[0]
    assert setup.startswith("export PATH="), setup
    return setup


def readme_try_it(checkout: Path) -> list[str]:
    """The commands of "Try it", each as typed in the terminal its first line set up."""
    setup, *typed = commands(readme_block(checkout, "Try it", "sh"))
    return [f"{setup}; {command}" for command in typed]


def get(url: str, host: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return fresh_copy(tmp_path_factory.mktemp("clone") / "orchestrator")


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
    assert result.stderr == f"error: {runtime.NOT_RUNNING}\n"
    assert result.stdout == ""


def test_the_readme_commands_reach_the_running_stack_and_the_flaky_example_ends_in_seconds(checkout, stack):
    trigger, status, status_json = readme_try_it(checkout)
    assert trigger.endswith("trigger_dag example_flaky --wait") and status_json.endswith("--json")

    started = time.monotonic()
    result = shell(checkout, trigger, timeout=30)
    assert result.returncode == 0, (result, stack.output)
    assert time.monotonic() - started < 20  # seconds, not the 600 s of a lost job
    lines = result.stdout.splitlines()
    run_id = lines[0]
    assert run_id.startswith("manual__") and lines[-1] == "success"
    progress = lines[1:-1]
    assert progress and all(line.startswith("tasks: ") for line in progress), lines  # one plain line per change
    assert progress[-1] == "tasks: 2/2 done, 0 running, 0 failed; run: success"

    summary = shell(checkout, status)
    assert summary.returncode == 0, summary
    assert f"example_flaky {run_id}: success" in summary.stdout
    assert re.search(r"flaky\s+success\s+try 2/3 ", summary.stdout), summary.stdout

    document = shell(checkout, status_json)
    assert document.returncode == 0, document
    run = json.loads(document.stdout)
    assert run["run_id"] == run_id and run["state"] == "success"
    flaky = next(ti for ti in run["task_instances"] if ti["task_id"] == "flaky")
    assert (flaky["try_number"], flaky["max_tries"], flaky["state"]) == (2, 3, "success")
    reasons = [(a["context"] or {}).get("reason") for ti in run["task_instances"] for a in ti["attempts"]]
    assert "queue_lost" not in reasons and reasons.count("task_exception") == 1, reasons


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
    assert "Quit the server with CONTROL-C." in before and '"GET /healthz' in before, stack.output
    assert "DEBUG on" in before
    time.sleep(1)
    after = [line for line in stack.lines[banner:] if "| " in line]
    assert after == [], after  # no server line comes after the banner while nothing happens
    base = re.search(r"running at (\S+)", stack.lines[banner]).group(1)
    status, page = get(base + "no-such-page/")
    assert status == 404 and "Using the URLconf defined in" in page  # Django's debug page


def test_with_the_stack_down_a_command_says_so_in_one_line_and_uses_no_other_redis(checkout):
    runtime_path = runtime.runtime_file(checkout / "var")
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
    runtime_path = runtime.runtime_file(checkout / "var")
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
        assert status == 404 and "Using the URLconf defined in" not in page
    finally:
        stack.stop()
