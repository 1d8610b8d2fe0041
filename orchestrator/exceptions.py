"""The orchestrator's exceptions.

Task code raises `NonRetryableError` or `RetryAfter` to say how its failure is to be treated,
or `Reschedule` to wait without holding a slot;
its task state raises `StaleAttempt` in an attempt that was superseded.
Operator actions and lookups raise an `ActionError`, whose `status` is the HTTP status the
API and the pages answer with.
"""
from __future__ import annotations

import math


class NonRetryableError(Exception):
    """Fail the task now: no retry, whatever budget is left (application/non_retryable)."""


class RetryAfter(Exception):
    """Retry after exactly `seconds` (e.g. an HTTP 429's Retry-After); still charges the user budget."""

    def __init__(self, seconds: float, message: str = "") -> None:
        seconds = float(seconds)
        if not math.isfinite(seconds) or seconds < 0:  # NaN would reach the failure's metadata
            raise ValueError(f"RetryAfter seconds must be a finite number >= 0, got {seconds}")
        self.seconds = seconds
        super().__init__(message or f"retry after {seconds:g}s")


class Reschedule(Exception):
    """Come back after `seconds` without holding a slot: the attempt ends `rescheduled`, charged
    to neither budget, and the task is sent again with the same try (bounded by `wait_timeout`)."""

    def __init__(self, seconds: float, message: str = "") -> None:
        seconds = float(seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"Reschedule seconds must be a finite number >= 0, got {seconds}")
        self.seconds = seconds
        super().__init__(message or f"reschedule in {seconds:g}s")


class StaleAttempt(Exception):
    """Raised in a task whose attempt was superseded (a newer attempt of the same task instance
    owns it now) when it tries to change its task state: nothing was changed."""


class ActionError(Exception):
    """An action or lookup that cannot be done; `status` is the HTTP status it maps to, and
    `field`, when set, the request's field at fault (`conf.team`), which the API's error names."""

    status = 409
    field: str | None = None


class BadRequest(ActionError):
    status = 400


class Forbidden(ActionError):
    status = 403


class NotFound(ActionError):
    status = 404


class Conflict(ActionError):
    status = 409
