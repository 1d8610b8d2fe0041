"""The attempt's heartbeat, on a thread of its own so a slow database never stalls the
supervisor's loop (its timeouts, its shutdown grace, its kills).

It also keeps the attempt's lease: with the database out of reach the task may go on only
while the scheduler cannot yet have presumed it lost, which it does HEARTBEAT_TIMEOUT after the
last heartbeat it recorded (recorded after we sent it). `lease_expired()` turns true a margin
(one interval) before that, so a copy started elsewhere never runs beside this one.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from django.db import InterfaceError, OperationalError, connection

from orchestrator.engine import reporting

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        task_instance_id: int,
        token: int,
        *,
        interval: float,
        timeout: float,
        on_beat: Callable[[], None] | None = None,
    ) -> None:
        self.task_instance_id = task_instance_id
        self.token = token
        self.interval = interval
        self.timeout = timeout
        self.on_beat = on_beat
        self.lease_from = time.monotonic()  # when the last heartbeat that got through was sent
        self.refused = False  # the attempt is no longer current
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> bool:
        """One heartbeat, in the calling thread; False once the attempt is no longer current."""
        sent = time.monotonic()
        try:
            current = reporting.heartbeat(self.task_instance_id, self.token)
        except (OperationalError, InterfaceError):
            log.warning("heartbeat of task instance %s attempt %s failed; will retry", self.task_instance_id, self.token, exc_info=True)
            connection.close()
            return not self.refused
        if current:
            self.lease_from = sent
        else:
            self.refused = True
        if self.on_beat is not None:
            try:
                self.on_beat()
            except Exception:
                log.warning("queue heartbeat failed", exc_info=True)
        return current

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.task_instance_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # A heartbeat stuck on an unreachable database must not hold up the report.
            self._thread.join(timeout=self.interval + 1)

    def lease_expired(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        margin = min(self.interval, self.timeout / 2)
        return now - self.lease_from >= self.timeout - margin

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if not self.beat():
                    return
        finally:
            connection.close()  # this thread's own connection
