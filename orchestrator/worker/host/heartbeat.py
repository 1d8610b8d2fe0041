"""One heartbeat for all the attempts of a worker, on a thread of its own, so a slow database
never stalls a supervisor's loop (its timeouts, its shutdown grace, its kills).

Every interval it sends one fenced statement for every attempt the worker holds
(`reporting.heartbeat_many`); an attempt whose row no longer matches (a newer dispatch, an
operator's mark) is refused, and its supervisor kills its task at once.

A statement the database refuses for another reason than a lost connection (a trigger, a
constraint, bad data in one row) is split in halves until the rows at fault are found, so one
such row never stops the heartbeat of the others. Only the attempts whose own row refuses it are
kept as through an outage (their leases in Redis, for the outage tolerance since their refusal
began; their statements sent one by one after the others), then they stop.

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
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from orchestrator.engine import leases, reporting
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.foundation.sanitise import error_text

log = logging.getLogger(__name__)


@dataclass(eq=False)
class AttemptLease:
    task_instance_id: int
    token: int
    timeout: float
    margin: float
    lease_from: float = field(default_factory=time.monotonic)  # the claim just recorded a heartbeat
    refused: bool = False  # the attempt is no longer current
    # Since when the database refuses this attempt's own heartbeat (not for want of a connection).
    db_refused_at: float | None = None

    def expired(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return now - self.lease_from >= self.timeout - self.margin

    def refusal_outlasted(self, now: float, tolerance: float) -> bool:
        """Its heartbeat has been refused for the outage tolerance: its lease is kept no longer."""
        return self.db_refused_at is not None and now - self.db_refused_at >= tolerance


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
            suspects = frozenset((lease.task_instance_id, lease.token) for lease in leases if lease.db_refused_at is not None)
            self._in_flight = (self._database.submit(_heartbeat_many, attempts, suspects), leases, sent)
        future, sent_leases, sent_at = self._in_flight
        try:
            superseded, refused = future.result(timeout=self.db_wait)
        except FutureTimeout:
            if self.database_lost_at is None:
                log.warning("the database did not answer a heartbeat within %.1fs", self.db_wait)
            return False
        except (OperationalError, InterfaceError):
            self._in_flight = None
            return False
        except Exception:
            # Not the database's answer (a row's refusal is found by `_heartbeat_many`): kept as
            # through an outage, for the outage tolerance at most. Its traceback once.
            log.error("the heartbeat statement failed", exc_info=self.database_lost_at is None)
            self._in_flight = None
            return False
        finally:
            if self._in_flight is not None and self._in_flight[0].done():
                self._in_flight = None
        for lease in sent_leases:
            attempt = (lease.task_instance_id, lease.token)
            if attempt in superseded:
                lease.refused = True
            elif attempt in refused:
                if lease.db_refused_at is None:
                    lease.db_refused_at = sent_at
                    log.error(
                        "the database refused the heartbeat of task instance %s attempt %s: %s; its lease is kept in Redis "
                        "for the outage tolerance at most", *attempt, refused[attempt],
                    )  # fmt: skip
            else:
                lease.db_refused_at = None
                lease.lease_from = max(lease.lease_from, sent_at)
        self._keep_refused([lease for lease in sent_leases if (lease.task_instance_id, lease.token) in refused], sent_at)
        if sent_at != sent:
            return False  # the answer to an older beat: this one still needs a lease from somewhere
        self.database_lost_at = None
        return True

    def _keep_refused(self, refused: list[AttemptLease], sent: float) -> None:
        """The attempts whose own row refuses the heartbeat: their leases renewed in Redis, as
        through an outage, until their refusal has lasted the outage tolerance; then their
        leases run out and their supervisors stop them before any scheduler presumes them lost."""
        kept = [lease for lease in refused if not lease.refusal_outlasted(sent, self.outage_tolerance)]
        if not kept:
            return
        try:
            attempts = [(lease.task_instance_id, lease.token) for lease in kept]
            leases.renew(get_redis(socket_timeout=self.redis_wait), attempts, ttl=self.timeout, holder=self.holder)
        except redis.RedisError:
            log.warning("could not keep the leases of %d attempts whose heartbeat the database refuses", len(kept))
            return
        for lease in kept:
            lease.lease_from = max(lease.lease_from, sent)

    def _keep_in_redis(self, leases_: list[AttemptLease], attempts: list[tuple[int, int]], sent: float) -> bool:
        """The database is away: renew the leases in Redis, within the outage tolerance (an
        attempt whose own row refused its heartbeat for that long is no longer kept)."""
        leases_ = [lease for lease in leases_ if not lease.refusal_outlasted(sent, self.outage_tolerance)]
        attempts = [(lease.task_instance_id, lease.token) for lease in leases_]
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
        # That thread's own connection: `connection.close` looked up here would be this thread's.
        self._database.submit(_close_connection)
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


def _close_connection() -> None:
    connection.close()


Attempt = tuple[int, int]


def _heartbeat_many(attempts: list[Attempt], suspects: frozenset[Attempt]) -> tuple[set[Attempt], dict[Attempt, str]]:
    """The heartbeat of `attempts`: returns those superseded, and those whose own row the
    database refused (with why). The attempts refused before (`suspects`) go one by one after
    the others, so a row that goes on refusing costs one statement a beat, not a search."""
    superseded: set[Attempt] = set()
    refused: dict[Attempt, str] = {}
    others = [attempt for attempt in attempts if attempt not in suspects]
    try:
        for group in ([others] if others else []) + [[attempt] for attempt in attempts if attempt in suspects]:
            _beat_or_bisect(group, superseded, refused)
    except (OperationalError, InterfaceError):
        connection.close()  # a broken connection is not kept for the next beat
        raise
    return superseded, refused


def _beat_or_bisect(attempts: list[Attempt], superseded: set[Attempt], refused: dict[Attempt, str]) -> None:
    """One statement for `attempts`; refused (not for want of a connection), each half again,
    down to the rows at fault."""
    try:
        superseded.update(reporting.heartbeat_many(attempts))
    except (OperationalError, InterfaceError):
        raise  # the database is away (or timed out): an outage for all, not one row's refusal
    except DatabaseError as exc:
        if len(attempts) == 1:
            refused[attempts[0]] = error_text(exc)
            return
        half = len(attempts) // 2
        _beat_or_bisect(attempts[:half], superseded, refused)
        _beat_or_bisect(attempts[half:], superseded, refused)
