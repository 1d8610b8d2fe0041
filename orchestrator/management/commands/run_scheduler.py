"""python manage.py run_scheduler [--once]: the scheduler loop."""
from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

import redis
from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection

from alerts.sending import Sender
from deadlines.check import check_due
from orchestrator.engine.scheduler import schedule_once
from orchestrator.foundation import liveness, memtrim
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.management.system_checks import ENGINE_PROCESS_CHECKS

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Create due runs, dispatch ready tasks, find lost workers and jobs, check deadlines, send alert notifications."
    requires_system_checks = ENGINE_PROCESS_CHECKS  # not the URL checks: see orchestrator/management/system_checks.py

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Run one pass and exit.")

    def handle(self, *args, once: bool = False, **options):
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        # Alert notifications go out from threads of their own, never from the pass (alerts/sending.py).
        sender = None if once else Sender().start()
        try:
            self.loop(once, lambda: stopping)
        finally:
            if sender is not None:
                sender.stop()

    def loop(self, once: bool, stopped: Callable[[], bool]) -> None:
        last_deadline_check = 0.0
        last_trim = 0.0
        while True:
            run_pass_safely()
            if once or time.monotonic() - last_deadline_check >= float(settings.ORCHESTRATOR_DEADLINE_CHECK_INTERVAL):
                # Keep going while a batch came back full: a backlog drains at once.
                while check_due_safely() and not stopped():
                    pass
                last_deadline_check = time.monotonic()
            record_beat()
            if once or stopped():
                return
            if time.monotonic() - last_trim >= TRIM_EVERY:
                memtrim.trim()  # what the passes freed, given back to the system
                last_trim = time.monotonic()
            _sleep(float(settings.ORCHESTRATOR_SCHEDULER_INTERVAL), stopped)


# How often (seconds) the scheduler gives back the memory its passes freed: a millisecond or so.
TRIM_EVERY = 10.0


def record_beat() -> None:
    """A pass ended: what `check_alive scheduler` (a container's liveness probe) reads."""
    try:
        liveness.record_scheduler_beat(get_redis())
    except redis.RedisError:
        log.debug("could not record the scheduler's heartbeat", exc_info=True)


def run_pass_safely() -> None:
    """One pass; whatever it raises (a database gone mid-pass, a bug) is logged, and the loop
    goes on to the next pass rather than the scheduler dying."""
    try:
        close_old_connections()
        schedule_once()
    except Exception:
        log.exception("scheduler pass failed; trying again next pass")
        try:
            connection.close()
        except Exception:
            pass


def check_due_safely() -> bool:
    """True when the check found a full batch and should run again at once."""
    limit = 500
    try:
        return check_due(shared_now(), limit=limit) >= limit
    except Exception:
        log.exception("deadline check failed")
        return False


def _sleep(seconds: float, should_stop) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not should_stop():
        time.sleep(min(0.1, seconds))
