"""How a command in another terminal finds the local stack that `make run` started.

`run_local` writes a small runtime file (`var/local-stack.json`) once its database is ready
and its Redis answers, and removes it when it stops. The settings read it when DATABASE_URL or
REDIS_URL is not in the environment, so `manage.py trigger_dag ...` from the same checkout
uses that stack's database and Redis. A file whose owner process is gone (the runner was
killed outright) is ignored. With no stack and no REDIS_URL, a command that needs Redis stops
with one line instead of trying whatever listens on the default port.

This module is imported by the settings: it must not import Django.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

FILE_NAME = "local-stack.json"
NOT_RUNNING = "the local stack is not running: start it with make run (or set REDIS_URL)"
# What REDIS_URL holds when there is neither REDIS_URL nor a running stack: a socket that
# cannot exist, so nothing ever reaches some other Redis by accident, and any error names why.
NO_REDIS_URL = "unix:///nonexistent/the-local-stack-is-not-running.sock"
# Commands that cannot do their job without Redis: they stop at start-up with NOT_RUNNING.
REDIS_COMMANDS = frozenset(
    {"trigger_dag", "run_worker", "run_scheduler", "runserver", "rqworker", "rqscheduler", "rqenqueue", "rqstats"}
)
# The runner itself never uses another stack's file: it starts its own.
RUNNER_COMMAND = "run_local"


@dataclass(frozen=True)
class StackInfo:
    """What the runtime file holds. `started` is the owner's start time as the kernel
    counts it, so a pid reused by an unrelated process does not look like the runner."""

    pid: int
    started: str
    database_url: str
    redis_url: str
    web_url: str


def runtime_file(var_dir: Path) -> Path:
    return Path(var_dir) / FILE_NAME


def default_database_url(var_dir: Path) -> str:
    """The SQLite file used when DATABASE_URL is not set."""
    return f"sqlite:///{Path(var_dir) / 'orchestrator.sqlite3'}"


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    if fields[0] == "Z":
        return None  # a zombie has exited
    return fields[19]


def owner_alive(info: StackInfo) -> bool:
    if Path("/proc/self/stat").exists():
        return process_start_time(info.pid) == info.started
    try:  # no /proc: the pid alone has to do
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def info_for_this_process(database_url: str, redis_url: str, web_url: str) -> StackInfo:
    pid = os.getpid()
    return StackInfo(pid, process_start_time(pid) or "", database_url, redis_url, web_url)


def write(path: Path, info: StackInfo) -> None:
    """Atomically (a reader sees the old file or the new one, never half of one); mode 0600
    because the URLs may hold passwords."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(info), handle)
    os.replace(draft, path)


def read(path: Path) -> StackInfo | None:
    """The file's contents, or None when it is missing or not one of ours."""
    try:
        data = json.loads(Path(path).read_text())
        return StackInfo(
            pid=int(data["pid"]),
            started=str(data["started"]),
            database_url=str(data["database_url"]),
            redis_url=str(data["redis_url"]),
            web_url=str(data.get("web_url", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_live(path: Path) -> StackInfo | None:
    """The running stack's details, or None when there is none (no file, or a stale one)."""
    info = read(path)
    return info if info is not None and owner_alive(info) else None


def remove_if_ours(path: Path, pid: int | None = None) -> None:
    """Remove the file only if this process (or `pid`) wrote it: never another stack's."""
    info = read(path)
    if info is not None and info.pid == (pid or os.getpid()):
        try:
            Path(path).unlink()
        except FileNotFoundError:
            pass


def command_of(argv: Sequence[str]) -> str:
    return argv[1] if len(argv) > 1 else ""


def stack_for(argv: Sequence[str], environ: Mapping[str, str], var_dir: Path) -> StackInfo | None:
    """The stack whose database and Redis this process should use for what its environment
    does not set; None when the environment sets both, or for the runner itself."""
    if environ.get("DATABASE_URL") and environ.get("REDIS_URL"):
        return None
    if command_of(argv) == RUNNER_COMMAND:
        return None
    return read_live(runtime_file(var_dir))


def database_url(environ: Mapping[str, str], stack: StackInfo | None, var_dir: Path) -> str:
    """DATABASE_URL when set, else the running stack's, else the SQLite file in var/."""
    return environ.get("DATABASE_URL") or (stack.database_url if stack else "") or default_database_url(var_dir)


def redis_url(environ: Mapping[str, str], stack: StackInfo | None) -> str:
    """REDIS_URL when set, else the running stack's, else NO_REDIS_URL."""
    return environ.get("REDIS_URL") or (stack.redis_url if stack else "") or NO_REDIS_URL


def needs_redis(argv: Sequence[str]) -> bool:
    """Whether this command line runs a command that cannot work without Redis (asking for
    its help does not count)."""
    return command_of(argv) in REDIS_COMMANDS and not any(arg in ("-h", "--help") for arg in argv[2:])


def stop_if_redis_missing(argv: Sequence[str], url: str) -> None:
    """Exit with NOT_RUNNING, on one line and with code 1, when a command that needs Redis has none."""
    if url == NO_REDIS_URL and needs_redis(argv):
        sys.stderr.write(f"error: {NOT_RUNNING}\n")
        raise SystemExit(1)
