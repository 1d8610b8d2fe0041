"""Fixtures of the fault suite: the worker tests' real workers, plus private Redis servers,
scheduler processes, and helpers to wait for a whole run and to find a DAG's processes."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from orchestrator.engine.scheduler import schedule_once
from orchestrator.foundation import redis_conn
from orchestrator.models import DagRun
from tests.conftest import wait_until
from tests.faults.invariants import SETTLED_TASK_STATES
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, worker  # noqa: F401  (fixtures)

T = "tests.faults.tasks."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server of the test's own on a free port: no persistence, so a restart is empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="faults-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("no redis-server binary")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis_lib.Redis.from_url(self.url, socket_connect_timeout=0.2)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis_lib.RedisError:
                return False

        wait_until(up, timeout=10, message="private redis-server to answer")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart_empty(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_redis(settings) -> Iterator[PrivateRedis]:
    """A private Redis that this test process (its enqueues, its scheduler passes) uses too."""
    server = PrivateRedis()
    server.start()
    old = settings.REDIS_URL
    settings.REDIS_URL = server.url
    redis_conn._clients.clear()
    try:
        yield server
    finally:
        settings.REDIS_URL = old
        redis_conn._clients.clear()
        server.close()


@pytest.fixture
def scheduler_process(spawn) -> Callable[..., subprocess.Popen]:
    """Start `run_scheduler` (fast passes); its output is drained and printed at teardown."""
    logs: list[tuple[int, list[str]]] = []

    def start(**env: Any) -> subprocess.Popen:
        merged = {
            "ORCHESTRATOR_SCHEDULER_INTERVAL": "0.1",
            "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "2",
            "ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY": "0",
            **{k: str(v) for k, v in env.items()},
        }
        proc = spawn("run_scheduler", env=merged)
        lines: list[str] = []
        logs.append((proc.pid, lines))
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        return proc

    yield start
    for pid, lines in logs:
        print(f"--- scheduler {pid} ---\n{''.join(lines[-200:])}")


def settle_runs(runs: list[DagRun], timeout: float = 40.0, *, passes: bool = True) -> list[DagRun]:
    """Until every task of every run has settled (scheduler passes in this process if `passes`)."""

    def done() -> bool:
        if passes:
            schedule_once()
        for run in runs:
            states = set(run.task_instances.values_list("state", flat=True))
            if not states <= SETTLED_TASK_STATES:
                return False
        return True

    wait_until(done, timeout=timeout, interval=0.1, message="every task to settle")
    if passes:
        schedule_once()  # let the runs end
    for run in runs:
        run.refresh_from_db()
    return runs


def is_spare(pid: int) -> bool:
    """A fork server's spare: the next task process, forked ahead, that runs no task yet."""
    from orchestrator.worker.forkserver.server import SPARE_NAME

    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == SPARE_NAME
    except OSError:
        return False


def task_processes(worker_pid: int) -> list[int]:
    """The live task processes of a worker (children of its fork server) and every live member
    of their process groups."""
    from orchestrator.worker.host.procs import live_members

    found: set[int] = set()
    for server in children_of(worker_pid):
        try:
            with open(f"/proc/{server}/cmdline", "rb") as f:
                if b"forkserver" not in f.read():
                    continue
        except OSError:
            continue
        for task in children_of(server):
            if alive(task) and not is_spare(task):
                found.add(task)
                found.update(live_members(task))
    return sorted(found)


def dag_processes(dag_id: str) -> list[int]:
    """Live processes (not zombies) started with an environment that names `dag_id` (what a task
    process exec'ed: bash, its subprocesses; the forked task process itself is not seen here)."""
    needle = f"ORCHESTRATOR_DAG_ID={dag_id}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry.name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _processes() -> Iterator[tuple[int, str, int]]:
    """(pid, state, parent pid) of every process, from /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield int(entry.name), fields[0], int(fields[1])


def zombies_of(parent: int) -> list[int]:
    return [pid for pid, state, ppid in _processes() if ppid == parent and state == "Z"]


def children_of(parent: int) -> list[int]:
    return [pid for pid, _, ppid in _processes() if ppid == parent]


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


@pytest.fixture
def records(tmp_path) -> Path:
    path = tmp_path / "records"
    path.mkdir()
    return path
