"""A PostgreSQL cluster of a test's own (initdb into a temporary directory as the postgres user,
on a free port), for the tests that stop or hang the metadata database: never the machine's
shared cluster. Commands run against it as real processes (`Processes`)."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A throwaway PostgreSQL cluster: its own data directory, socket directory and port."""

    def __init__(self) -> None:
        binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if os.geteuid() != 0 or not binaries or not shutil.which("runuser"):
            pytest.skip("needs root, runuser and PostgreSQL's server binaries (initdb, pg_ctl)")
        self.bin = Path(binaries[-1]).parent
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="private-pg-"))
        self.data = self.dir / "data"
        shutil.chown(self.dir, "postgres", "postgres")
        self._as_postgres("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    def engine_environment(self, spool: Path, **settings: str) -> dict[str, str]:
        """The environment of this checkout's commands against the cluster's `orchestrator`
        database (made here): short heartbeats, quick passes, the spool given; `settings` on top."""
        query(self.url.rsplit("/", 1)[0] + "/postgres", "CREATE DATABASE orchestrator")
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "DATABASE_URL": self.url,
            "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.5",
            "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "3",
            "ORCHESTRATOR_REPORT_PATIENCE": "2",
            "ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2",
            "ORCHESTRATOR_SPOOL_DIR": str(spool),
            **settings,
        }

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/orchestrator"

    def _as_postgres(self, tool: str, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bin / tool), *args], check=True, capture_output=True, timeout=180)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "-t", "120", "start")

    def stop(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "120", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def close(self) -> None:
        try:
            if self.running():
                self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def query(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description is not None else []


class Processes:
    """run_worker / run_scheduler / other commands against the private cluster; killed at the end."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[tuple[subprocess.Popen, list[str]]] = []

    def start(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args], env=self.env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        self.procs.append((proc, lines))
        return proc

    def run(self, *args: str) -> str:
        result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def close(self) -> None:
        for proc, lines in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)
            print(f"--- {' '.join(proc.args[2:])} ({proc.pid}) ---\n{''.join(lines[-150:])}")
