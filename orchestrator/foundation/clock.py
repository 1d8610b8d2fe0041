"""One clock for every decision that several processes share: the database's.

Heartbeats and leases are compared with the database's own `CURRENT_TIMESTAMP` (`Now`,
`db_now`). Times that one process writes and another compares (`next_retry_at`, a run's
`queued_at`, a task's start and end, which deadlines are measured from) come from
`shared_now()`: this process's clock corrected by its measured offset from the database's,
re-measured every OFFSET_TTL seconds, so a worker whose clock is minutes off still schedules a
retry on the database's time, at the cost of one query per process every minute. While the
database is unreachable the last offset holds: `shared_now()` never raises for want of it.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import Error, connection
from django.db.models.functions import Now
from django.utils import timezone

__all__ = ["Now", "db_now", "local_now", "shared_now"]

log = logging.getLogger(__name__)

OFFSET_TTL = 60.0
OFFSET_RETRY = 10.0  # seconds between measurements while the database is unreachable

_offset_lock = threading.Lock()
_offset: tuple[float, timedelta] | None = None  # (monotonic time measured, database - local)


def local_now() -> datetime:
    """This process's clock (ORCHESTRATOR_CLOCK_SKEW shifts it, to test a skewed machine)."""
    skew = float(getattr(settings, "ORCHESTRATOR_CLOCK_SKEW", 0.0) or 0.0)
    now = timezone.now()
    return now + timedelta(seconds=skew) if skew else now


def db_now() -> datetime:
    """The current time as the metadata database sees it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT CURRENT_TIMESTAMP")
            return cursor.fetchone()[0]
    # SQLite runs in this process on this machine: its clock is ours.
    return local_now()


def shared_now() -> datetime:
    """The database's time, without a query on most calls. Never raises for want of the
    database: while it is unreachable the last measured offset holds (none measured yet: this
    machine's clock), and it is measured again every OFFSET_RETRY seconds until it answers, so
    the report path never needs the database before it can spool an outcome."""
    global _offset
    measured = _offset
    if measured is None or time.monotonic() - measured[0] > OFFSET_TTL:
        measured = _measure(measured)
    return local_now() + measured[1]


def _measure(last: tuple[float, timedelta] | None) -> tuple[float, timedelta]:
    global _offset
    try:
        before = local_now()
        database = db_now()
        after = local_now()
    except Error:  # OperationalError, InterfaceError, ... (Django's base of them all)
        # Keep what we had, and look again in OFFSET_RETRY seconds rather than on every call
        # (each try may wait for a connect timeout).
        offset = last[1] if last is not None else timedelta(0)
        log.warning("could not measure the clock offset from the database; keeping %s", offset)
        measured = (time.monotonic() - OFFSET_TTL + OFFSET_RETRY, offset)
    else:
        # The database read its clock somewhere between our two readings: take the middle.
        measured = (time.monotonic(), database - (before + (after - before) / 2))
    with _offset_lock:
        _offset = measured
    return measured
