"""Exceptions a task raises to tell the orchestrator how to treat its failure (contract §5)."""
from __future__ import annotations


class NonRetryableError(Exception):
    """Fail the task now: no retry, whatever budget is left (application/non_retryable)."""


class RetryAfter(Exception):
    """Retry after exactly `seconds` (e.g. an HTTP 429's Retry-After); still charges the user budget."""

    def __init__(self, seconds: float, message: str = "") -> None:
        seconds = float(seconds)
        if seconds < 0:
            raise ValueError(f"RetryAfter seconds must be >= 0, got {seconds}")
        self.seconds = seconds
        super().__init__(message or f"retry after {seconds:g}s")
