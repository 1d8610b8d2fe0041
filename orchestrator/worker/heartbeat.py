"""One heartbeat for all the attempts of a worker, on a thread of its own, so a slow database
never stalls a supervisor's loop (its timeouts, its shutdown grace, its kills).

Every interval it sends one fenced statement for every attempt the worker holds
(`reporting.heartbeat_many`); an attempt whose row no longer matches (a newer dispatch, an
operator's mark) is refused, and its supervisor kills its task at once.

It also keeps each attempt's lease: with the database out of reach a task may go on only while
the scheduler cannot yet have presumed it lost, which it does HEARTBEAT_TIMEOUT after the last
heartbeat it recorded (recorded after we sent it). `expired()` turns true a margin (one
interval) before that, so a copy started elsewhere never runs beside this one.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from django.db import InterfaceError, OperationalError, connection

from orchestrator.engine import reporting

log = logging.getLogger(__name__)


@dataclass(eq=False)
class AttemptLease:
    task_instance_id: int
    token: int
    timeout: float
    margin: float
    lease_from: float = field(default_factory=time.monotonic)  # the claim just recorded a heartbeat
    refused: bool = False  # the attempt is no longer current

    def expired(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return now - self.lease_from >= self.timeout - self.margin


class Heartbeats:
    def __init__(self, *, interval: float, timeout: float, on_beat: Callable[[], None] | None = None) -> None:
        self.interval = interval
        self.timeout = timeout
        self.on_beat = on_beat  # RQ's own records of the running jobs
        self._leases: set[AttemptLease] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, task_instance_id: int, token: int) -> AttemptLease:
        lease = AttemptLease(task_instance_id, token, self.timeout, min(self.interval, self.timeout / 2))
        with self._lock:
            self._leases.add(lease)
        return lease

    def forget(self, lease: AttemptLease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def beat(self) -> None:
        """One heartbeat for every attempt held now."""
        with self._lock:
            leases = list(self._leases)
        if leases:
            sent = time.monotonic()
            try:
                refused = reporting.heartbeat_many([(lease.task_instance_id, lease.token) for lease in leases])
            except (OperationalError, InterfaceError):
                log.warning("heartbeat of %d attempts failed; will retry", len(leases), exc_info=True)
                connection.close()
            else:
                for lease in leases:
                    if (lease.task_instance_id, lease.token) in refused:
                        lease.refused = True
                    else:
                        lease.lease_from = sent
        if self.on_beat is not None:
            try:
                self.on_beat()
            except Exception:
                log.warning("queue heartbeat failed", exc_info=True)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.beat()
        finally:
            connection.close()  # this thread's own connection
