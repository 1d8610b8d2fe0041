"""How far one attempt's "running" handshake got: what the supervisor knows of it at any time.

The handshake is recorded in the database (fenced by the attempt token) before the task is
told "go"; while the database is away it is tried again, and a try whose answer was lost may
have committed all the same. A plain mutable dataclass: it changes as the supervisor's loop
turns, in the worker, which imports no pydantic.
"""
from __future__ import annotations

from dataclasses import dataclass

# While the database cannot record a handshake, it is tried again this often.
RETRY_SECONDS = 1.0


@dataclass(slots=True)
class Handshake:
    at: float | None = None  # when it was recorded (monotonic): the task's code may run since
    failing_since: float | None = None  # the database could not record it since then
    retry_at: float | None = None  # when to try again
    ambiguous: bool = False  # a try failed: its commit may have happened anyway
    refused: str | None = None  # the database answered, and refused it: why

    @property
    def recorded(self) -> bool:
        return self.at is not None

    def unanswered(self, now: float, tolerance: float) -> bool:
        """A try went unanswered (the database away): True when it is to be tried again in a
        moment, False once the database has been away for `tolerance`."""
        self.ambiguous = True
        self.failing_since = self.failing_since or now
        if now - self.failing_since < tolerance:
            self.retry_at = now + RETRY_SECONDS
            return True
        return False

    def retry_due(self, now: float) -> bool:
        """Whether a try is due now (then it is no longer pending)."""
        if self.retry_at is None or now < self.retry_at:
            return False
        self.retry_at = None
        return True
