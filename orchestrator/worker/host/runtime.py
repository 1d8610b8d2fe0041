"""What every slot of a running worker shares: its name, its fork server's launcher, its
heartbeat thread, its pool of database connections, its spool, and the way a slot hands its
place to the task its report dispatched to it (`engine/handover.py`).

The RQ worker (`rqworker.py`) builds it when it starts working and drops it when it stops; a
job (`job.py`) reads it with `runtime()`, which is None outside a worker (a job run inline).
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError, connection

from orchestrator.data import sql
from orchestrator.engine.reporting import Claimed
from orchestrator.worker.host.heartbeat import Heartbeats
from orchestrator.worker.host.launcher import Launcher
from orchestrator.worker.host.memory import MemoryLimits
from orchestrator.worker.host.spool import Spool


def default_worker_name() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


class DatabasePool:
    """Runs database calls on a fixed number of threads, each with its own connection."""

    def __init__(self, size: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="db")
        self.unreachable = False  # the last call failed to reach the database

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._executor.submit(self._run, function, args, kwargs).result()

    def _run(self, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        try:
            # A call whose transaction met a plan a migration made stale runs once more.
            result = sql.once_more_if_stale(function, *args, **kwargs)
        except (OperationalError, InterfaceError):
            connection.close()  # a broken connection is not kept for the next call
            self.unreachable = True
            raise
        self.unreachable = False
        return result

    def reachable(self) -> bool:
        """Try the database now (one cheap query) and say whether it answered."""
        try:
            self.call(connection.ensure_connection)
            self.call(lambda: connection.cursor().execute("SELECT 1"))
        except (OperationalError, InterfaceError):
            return False
        return True

    def close(self) -> None:
        # Looked up in the pool's thread: `connection.close` looked up here would be this thread's.
        self._executor.submit(lambda: connection.close())  # best effort; the threads end with the process
        self._executor.shutdown(wait=True)


@dataclass(frozen=True)
class WorkerRuntime:
    """What every slot of the worker shares."""

    name: str
    launcher: Launcher
    heartbeats: Heartbeats
    db: DatabasePool
    spool: Spool
    # The queues a slot ending its task may offer to take the next one from (none while the
    # worker takes no jobs, or those with jobs waiting), and how the calling slot hands its
    # place to the task it was given (`engine/handover.py`).
    offered_queues: Callable[[], frozenset[str]]
    hand_on: Callable[[Claimed], None]
    # How it limits its attempts' memory: a cgroup per attempt, or a watch (None: watched).
    memory_limits: MemoryLimits | None = None


_runtime: WorkerRuntime | None = None


def runtime() -> WorkerRuntime | None:
    return _runtime


def install(shared: WorkerRuntime | None) -> None:
    """The worker's runtime from now on (None when the worker stops)."""
    global _runtime
    _runtime = shared
