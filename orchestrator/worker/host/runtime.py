"""What every slot of a running worker shares: its name, its fork server's launcher, its
heartbeat thread, its pool of database connections, its spool, and the way a slot hands its
place to the task its report dispatched to it (`engine/handover.py`).

The RQ worker (`rqworker.py`) builds it when it starts working and drops it when it stops; a
job (`job.py`) reads it with `runtime()`, which is None outside a worker (a job run inline).
"""
from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from orchestrator.data import sql
from orchestrator.engine.reporting import Claimed
from orchestrator.worker.host.heartbeat import Heartbeats
from orchestrator.worker.host.launcher import Launcher
from orchestrator.worker.host.memory import MemoryLimits
from orchestrator.worker.host.spool import Spool


def default_worker_name() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


class DatabasePool:
    """Database calls on a fixed number of connections, each lent to one calling thread at a
    time: the connections do not grow with the slots, and a call runs in the thread that makes
    it. (Handing each call to a thread of a pool of them cost two thread switches a call, four
    calls a task: about a tenth of a worker's CPU in a fan-out.)"""

    def __init__(self, size: int) -> None:
        self._free: queue.LifoQueue[BaseDatabaseWrapper] = queue.LifoQueue()
        for _ in range(size):
            lendable = connections.create_connection(DEFAULT_DB_ALIAS)
            lendable.inc_thread_sharing()  # used by one thread at a time, by whichever borrows it
            self._free.put(lendable)
        self._size = size
        self._borrower = threading.local()
        self.unreachable = False  # the last call failed to reach the database

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lent() as lent:
            try:
                # A call whose transaction met a plan a migration made stale runs once more.
                result = sql.once_more_if_stale(function, *args, **kwargs)
            except (OperationalError, InterfaceError):
                lent.close()  # a broken connection is not kept for the next call
                self.unreachable = True
                raise
        self.unreachable = False
        return result

    @contextmanager
    def _lent(self) -> Iterator[BaseDatabaseWrapper]:
        """One of the pool's connections as this thread's `connection` for the length of a call
        (the thread's own, if it has one, put back after it); a call made within a call uses
        the connection already lent."""
        held = getattr(self._borrower, "connection", None)
        if held is not None:
            yield held
            return
        lent = self._free.get()
        own = next((c for c in connections.all(initialized_only=True) if c.alias == DEFAULT_DB_ALIAS), None)
        connections[DEFAULT_DB_ALIAS] = lent
        self._borrower.connection = lent
        try:
            yield lent
        finally:
            self._borrower.connection = None
            if own is not None:
                connections[DEFAULT_DB_ALIAS] = own
            else:
                del connections[DEFAULT_DB_ALIAS]
            self._free.put(lent)

    def reachable(self) -> bool:
        """Try the database now (one cheap query) and say whether it answered."""
        try:
            self.call(lambda: connection.cursor().execute("SELECT 1"))
        except (OperationalError, InterfaceError):
            return False
        return True

    def close(self, patience: float = 5.0) -> None:
        """Close every connection, waiting up to `patience` seconds for each one lent out to come
        back (one that does not goes with the process)."""
        for _ in range(self._size):
            try:
                self._free.get(timeout=patience).close()
            except queue.Empty:
                return


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
