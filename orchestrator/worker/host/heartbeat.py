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

Every wait here is bounded: a database that hangs (packets dropped, a writer holding SQLite's
lock) is given `db_wait` seconds per beat, after which the beat counts it as away and keeps the
leases in Redis, while the statement still in flight finishes (or fails) on its own thread; Redis
is reached through a client whose timeouts are a fraction of the lease. So the fork server's
lease depends on Redis as long as Redis answers, however long the database hangs.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
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
        db_wait: float | None = None,
    ) -> None:
        self.interval = interval
        self.timeout = timeout
        self.outage_tolerance = outage_tolerance
        self.holder = holder
        self.on_beat = on_beat  # RQ's own records of the running jobs (on a thread of their own)
        self.on_lease = on_lease  # told how long the worker's lease now runs (the fork server)
        # How long one beat waits for the database before keeping the leases in Redis instead.
        self.db_wait = db_wait if db_wait is not None else max(0.2, min(interval, self.lease_seconds / 4))
        # How long renewing the leases in Redis may take: a fraction of the lease.
        self.redis_wait = max(self.db_wait, self.lease_seconds / 4)
        self.database_lost_at: float | None = None  # when heartbeats to the database began failing
        self._leases: set[AttemptLease] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rq_thread: threading.Thread | None = None
        # The database statement runs here, so a hung one never holds the beat.
        self._database = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heartbeat-db")
        self._in_flight: tuple[Future, list[AttemptLease], float] | None = None

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
        """One heartbeat for every attempt held now; returns within about `db_wait` plus one
        Redis call's timeout, whatever the database does."""
        with self._lock:
            leases = list(self._leases)
        kept = True
        if leases:
            sent = time.monotonic()
            attempts = [(lease.task_instance_id, lease.token) for lease in leases]
            if not self._beat_database(leases, attempts, sent):
                kept = self._keep_in_redis(leases, attempts, sent)
        if kept and self.on_lease is not None:
            try:
                self.on_lease(self.lease_seconds)
            except Exception:
                log.warning("could not extend the lease at the fork server", exc_info=True)

    def _beat_database(self, leases: list[AttemptLease], attempts: list[tuple[int, int]], sent: float) -> bool:
        """Send the heartbeat statement (unless one is still in flight) and wait `db_wait` for
        it; False when the database failed or did not answer in time."""
        if self._in_flight is None:
            self._in_flight = (self._database.submit(_heartbeat_many, attempts), leases, sent)
        future, sent_leases, sent_at = self._in_flight
        try:
            refused = future.result(timeout=self.db_wait)
        except FutureTimeout:
            if self.database_lost_at is None:
                log.warning("the database did not answer a heartbeat within %.1fs", self.db_wait)
            return False
        except (OperationalError, InterfaceError):
            self._in_flight = None
            return False
        except Exception:
            # Refused for another reason (a constraint, a trigger): kept as through an outage,
            # for the outage tolerance at most. Its traceback once, not every interval.
            log.error("the heartbeat statement failed", exc_info=self.database_lost_at is None)
            self._in_flight = None
            return False
        finally:
            if self._in_flight is not None and self._in_flight[0].done():
                self._in_flight = None
        for lease in sent_leases:
            if (lease.task_instance_id, lease.token) in refused:
                lease.refused = True
            else:
                lease.lease_from = max(lease.lease_from, sent_at)
        if sent_at != sent:
            return False  # the answer to an older beat: this one still needs a lease from somewhere
        self.database_lost_at = None
        return True

    def _keep_in_redis(self, leases_: list[AttemptLease], attempts: list[tuple[int, int]], sent: float) -> bool:
        """The database is away: renew the leases in Redis, within the outage tolerance."""
        if self.database_lost_at is None:
            self.database_lost_at = sent
            log.warning("the database is unreachable; keeping the leases of %d attempts in Redis", len(attempts))
        if sent - self.database_lost_at >= self.outage_tolerance:
            log.error("the database has been unreachable for %.0fs; no longer keeping the leases", sent - self.database_lost_at)
            return False
        try:
            leases.renew(get_redis(socket_timeout=self.redis_wait), attempts, ttl=self.timeout, holder=self.holder)
        except redis.RedisError:
            log.error("neither the database nor Redis is reachable; the running tasks stop when their leases run out")
            return False
        for lease in leases_:
            lease.lease_from = sent
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()
        if self.on_beat is not None:
            # RQ's records wait on Redis with RQ's own timeouts: never in the way of the leases.
            self._rq_thread = threading.Thread(target=self._run_rq_beats, name="rq-heartbeats", daemon=True)
            self._rq_thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._rq_thread):
            if thread is not None:
                thread.join(timeout=self.interval + self.db_wait + 1)
        self._database.submit(connection.close)  # that thread's own connection
        self._database.shutdown(wait=False)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception:  # the leases must outlive any one odd beat
                log.exception("heartbeat failed")

    def _run_rq_beats(self) -> None:
        on_beat = self.on_beat
        assert on_beat is not None
        failing = False
        while not self._stop.wait(self.interval):
            try:
                on_beat()
            except Exception as exc:
                # Once per outage with its traceback, not every interval.
                log.warning("queue heartbeat failed: %s", exc, exc_info=not failing)
                failing = True
            else:
                failing = False


def _heartbeat_many(attempts: list[tuple[int, int]]) -> set[tuple[int, int]]:
    try:
        return reporting.heartbeat_many(attempts)
    except (OperationalError, InterfaceError):
        connection.close()  # a broken connection is not kept for the next beat
        raise
