"""The local runner (`manage.py run_local`, what `make run` calls) and its embedded Redis server."""
from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import redis
from django.contrib.auth import get_user_model

from orchestrator.local import stack_file
from orchestrator.local.embedded_redis import EmbeddedRedis, free_port
from orchestrator.local.stack import ensure_admin
from tests.conftest import ROOT, wait_until


def _children_of(pid: int) -> set[int]:
    """Every live descendant of `pid`, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after the last ")".
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(entry.name)):
            found.append(f"{entry.name}: {cmdline}")
    return found


class Runner:
    """`manage.py run_local` in a subprocess, with its output collected as it comes."""

    def __init__(self, tmp_path: Path, port: int, **extra_env: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env.update(
            DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
            ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="2",
            ORCHESTRATOR_KILL_GRACE="1",
            DEBUG="0",
            **extra_env,
        )
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_local", "--port", str(port), "--state-dir", str(tmp_path / "var")],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
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

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def _login(base: str, username: str, password: str) -> urllib.request.OpenerDirector:
    """A browser-like client logged in through the login form (CSRF cookie and token)."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(base + "accounts/login/", timeout=5).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"})
    request = urllib.request.Request(base + "accounts/login/", data=form.encode(), headers={"Referer": base + "accounts/login/"})
    opener.open(request, timeout=5)
    return opener


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_it_runs_the_whole_stack_and_stops_every_process_on_sigterm(tmp_path):
    """With no REDIS_URL, run_local starts the bundled Redis, web, a scheduler and two workers,
    prints a working URL and login, and on SIGTERM stops all of them, Redis included."""
    port = free_port()
    runner = Runner(tmp_path, port)
    descendants: set[int] = set()
    try:
        wait_until(lambda: "Login: admin / " in runner.output or runner.process.poll() is not None, timeout=40, message="the login banner")
        assert runner.process.poll() is None, runner.output
        base = f"http://127.0.0.1:{port}/"
        assert f"Orchestrator is running at {base}" in runner.output
        password = re.search(r"Login: admin / (\S+)", runner.output).group(1)
        assert (tmp_path / "var" / "admin-password.txt").read_text().strip() == password

        descendants = _children_of(runner.process.pid)
        names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() for pid in descendants}
        assert any("redis-server" in cmd for cmd in names.values()), names
        workers = [pid for pid, cmd in names.items() if "run_worker" in cmd]
        assert len(workers) == 2, names
        # Every queue of the example DAGs is read: example_resumable's task runs on `resumable`.
        assert all(names[pid].split("run_worker", 1)[1].split()[:2] == ["default", "resumable"] for pid in workers), names
        assert sum("run_scheduler" in cmd for cmd in names.values()) == 1, names
        redis_url = re.search(r"Redis: (redis://127\.0\.0\.1:\d+/0) \(embedded", runner.output).group(1)
        assert redis.Redis.from_url(redis_url).ping()
        stack = stack_file.read_live(stack_file.runtime_file(tmp_path / "var"))  # what other terminals read
        assert stack is not None
        assert stack.pid == runner.process.pid
        assert stack.redis_url == redis_url

        with urllib.request.urlopen(base + "healthz", timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(base + "static/admin/css/base.css", timeout=5) as response:
            assert response.status == 200  # static files are served without DEBUG too
        client = _login(base, "admin", password)
        admin_page = client.open(base + "admin/", timeout=5).read().decode()
        assert "Site administration" in admin_page

        # A worker killed outright is started again (how the examples show a platform retry);
        # the rest of the stack stays up.
        os.kill(workers[0], signal.SIGKILL)
        wait_until(lambda: "exited with code -9; starting it again" in runner.output, timeout=10, message="the restart")
        wait_until(
            lambda: sum("run_worker" in _cmdline(pid) for pid in _children_of(runner.process.pid)) == 2,
            timeout=10, message="a second worker again",
        )
        assert runner.process.poll() is None, runner.output
        descendants |= _children_of(runner.process.pid)

        runner.process.send_signal(signal.SIGTERM)
        assert runner.process.wait(30) == 0, runner.output
        wait_until(lambda: not any(_alive(pid) for pid in descendants), timeout=5, message="every child to exit")
        assert _processes_mentioning(str(tmp_path)) == []
        assert "stopping the embedded Redis server" in runner.output
        assert not stack_file.runtime_file(tmp_path / "var").exists()
    finally:
        runner.kill()
        for pid in descendants:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
def test_it_refuses_a_port_that_is_taken(tmp_path):
    """A busy web port stops the runner at once with a message naming the port, before anything starts."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        runner = Runner(tmp_path, port)
        try:
            assert runner.process.wait(30) == 1
            runner.reader.join(5)
            assert f"port {port} on 127.0.0.1 is in use" in runner.output
            assert _processes_mentioning(str(tmp_path)) == []
        finally:
            runner.kill()


@pytest.mark.django_db
def test_it_creates_the_admin_once_and_keeps_printing_the_same_password(tmp_path):
    """The generated password is stored (mode 0600) and re-used: by later runs and by a fresh database."""
    password_file = tmp_path / "admin-password.txt"
    password = ensure_admin(password_file)
    assert password
    assert password_file.read_text().strip() == password
    assert password_file.stat().st_mode & 0o777 == 0o600
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser
    assert admin.check_password(password)

    assert ensure_admin(password_file) == password  # a re-run
    admin.delete()
    assert ensure_admin(password_file) == password  # the database was reset
    assert get_user_model().objects.get(username="admin").check_password(password)


@pytest.mark.django_db
def test_it_does_not_claim_to_know_a_password_it_did_not_set(tmp_path):
    """An existing admin user with no stored password is left alone and no password is printed."""
    get_user_model().objects.create_user("admin", password="chosen-by-someone")
    assert ensure_admin(tmp_path / "admin-password.txt") is None
    assert get_user_model().objects.get(username="admin").check_password("chosen-by-someone")


def test_it_starts_the_bundled_redis_and_keeps_its_data_across_restarts(tmp_path):
    """The embedded server answers on its own port and saves its data on SIGTERM, so a restart finds it."""
    with EmbeddedRedis(tmp_path / "redis") as server:
        process = server.process
        redis.Redis.from_url(server.url).set("queued-job", "ti-1")
    assert process.poll() is not None
    with EmbeddedRedis(tmp_path / "redis") as server:
        assert redis.Redis.from_url(server.url).get("queued-job") == b"ti-1"
