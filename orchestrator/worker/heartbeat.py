"""One heartbeat for all the attempts of a worker, on a thread of its own, so a slow database
never stalls a supervisor's loop (its timeouts, its shutdown grace, its kills).

Every interval it sends one fenced statement for every attempt the worker holds
(`reporting.heartbeat_many`); an attempt whose row no longer matches (a newer dispatch, an
operator's mark) is refused, and its supervisor kills its task at once.

It also keeps each attempt's lease. The scheduler presumes a task lost when its database
heartbeat is HEARTBEAT_TIMEOUT old and no lease of it is alive in Redis. So while the database
is out of reach but Redis is not, the heartbeat renews the attempts' leases in Redis instead
(for up to ORCHESTRATOR_DB_OUTAGE_TOLERANCE seconds) and the tasks go on. A lease that could be
renewed nowhere runs out locally a margin (one interval) before any scheduler could presume the
task lost (`expired()`), and its supervisor kills the task: a copy started elsewhere never runs
beside this one.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from django.db import InterfaceError, OperationalError, connection

from orchestrator.engine import leases, reporting
from orchestrator.redis_conn import get_redis

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
    def __init__(
        self,
        *,
        interval: float,
        timeout: float,
        outage_tolerance: float = 0.0,
        holder: str = "",
        on_beat: Callable[[], None] | None = None,
        on_lease: Callable[[float], None] | None = None,
    ) -> None:
        self.interval = interval
        self.timeout = timeout
        self.outage_tolerance = outage_tolerance
        self.holder = holder
        self.on_beat = on_beat  # RQ's own records of the running jobs
        self.on_lease = on_lease  # told how long the worker's lease now runs (the fork server)
        self.database_lost_at: float | None = None  # when heartbeats to the database began failing
        self._leases: set[AttemptLease] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, task_instance_id: int, token: int) -> AttemptLease:
        lease = AttemptLease(task_instance_id, token, self.timeout, min(self.interval, self.timeout / 2))
        with self._lock:
            self._leases.add(lease)
        return lease

    @property
    def lease_seconds(self) -> float:
        """How long a heartbeat that got through lets the worker's tasks run: a margin (one
        interval) less than the scheduler waits before presuming them lost."""
        return self.timeout - min(self.interval, self.timeout / 2)

    def forget_attempt(self, task_instance_id: int, token: int) -> None:
        """The attempt's outcome is recorded (or it was superseded): stop keeping its lease."""
        with self._lock:
            self._leases = {lease for lease in self._leases if (lease.task_instance_id, lease.token) != (task_instance_id, token)}

    def beat(self) -> None:
        """One heartbeat for every attempt held now."""
        with self._lock:
            leases = list(self._leases)
        kept = True
        if leases:
            sent = time.monotonic()
            attempts = [(lease.task_instance_id, lease.token) for lease in leases]
            try:
                refused = reporting.heartbeat_many(attempts)
            except (OperationalError, InterfaceError):
                connection.close()
                kept = self._keep_in_redis(leases, attempts, sent)
            else:
                self.database_lost_at = None
                for lease in leases:
                    if (lease.task_instance_id, lease.token) in refused:
                        lease.refused = True
                    else:
                        lease.lease_from = sent
        if kept and self.on_lease is not None:
            try:
                self.on_lease(self.lease_seconds)
            except Exception:
                log.warning("could not extend the lease at the fork server", exc_info=True)
        if self.on_beat is not None:
            try:
                self.on_beat()
            except Exception:
                log.warning("queue heartbeat failed", exc_info=True)

    def _keep_in_redis(self, leases_: list[AttemptLease], attempts: list[tuple[int, int]], sent: float) -> bool:
        """The database is away: renew the leases in Redis, within the outage tolerance."""
        if self.database_lost_at is None:
            self.database_lost_at = sent
            log.warning("the database is unreachable; keeping the leases of %d attempts in Redis", len(attempts))
        if sent - self.database_lost_at >= self.outage_tolerance:
            log.error("the database has been unreachable for %.0fs; no longer keeping the leases", sent - self.database_lost_at)
            return False
        try:
            leases.renew(get_redis(), attempts, ttl=self.timeout, holder=self.holder)
        except redis.RedisError:
            log.error("neither the database nor Redis is reachable; the running tasks stop when their leases run out")
            return False
        for lease in leases_:
            lease.lease_from = sent
        return True

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
