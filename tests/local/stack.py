"""A fresh copy of the repository and `make run`'s stack in it, driven as a user's terminals
would: the helpers of the tests that follow the README and the docs."""
from __future__ import annotations

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
from pathlib import Path

from tests.conftest import ROOT, wait_until

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
