"""The worker's shutdown request, set by its signal handler and read by the supervisor loop.

The job runs in the worker process itself, so a module-level flag is shared by both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class ShutdownRequest:
    requested_at: float | None = None  # time.monotonic() of the first signal
    signal: str | None = None
    urgent: bool = False  # a second signal: stop the running task now, without the grace

    def request(self, signal_name: str) -> None:
        if self.requested_at is None:
            self.requested_at = time.monotonic()
            self.signal = signal_name
        else:
            self.urgent = True

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def grace_over(self, grace: float, now: float | None = None) -> bool:
        """Whether the running task must now be stopped."""
        if self.requested_at is None:
            return False
        now = time.monotonic() if now is None else now
        return self.urgent or now - self.requested_at >= grace


SHUTDOWN = ShutdownRequest()
