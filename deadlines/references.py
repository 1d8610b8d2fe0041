"""Need-by times: a reference timestamp plus an interval. Pure functions, no database.

Every resolver takes the facts it needs as arguments (and `now` where the reference is "this
moment"), so the rules are tested without a run, a clock or a database.

Timezones: `fixed_datetime` written without an offset is wall-clock time in the DAG's timezone,
and the interval of `dagrun_logical_date` is added on the DAG's wall clock, so "logical date
(local midnight) + 9 h" is 9 AM local on the days clocks change too. The event references
(`dagrun_queued_at`, `average_runtime`, `task_queued_at`, `task_started_at`) add elapsed
seconds: "one hour after it was queued" is 3600 real seconds whatever the clock says.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from deadlines.models import Reference

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class DefinitionError(ValueError):
    """A definition that cannot give a need-by time (e.g. fixed_datetime without a datetime)."""


@dataclass(frozen=True)
class Facts:
    """What is known about a run (and task) when its deadline is computed."""

    now: datetime
    tz: ZoneInfo
    queued_at: datetime | None = None
    logical_date: datetime | None = None
    task_queued_at: datetime | None = None
    task_started_at: datetime | None = None
    # Durations in seconds of the DAG's recent successful runs, newest first (average_runtime).
    recent_run_durations: Sequence[float] = field(default_factory=tuple)


def plus_elapsed(reference: datetime, interval: float) -> datetime:
    """`interval` real seconds after `reference`."""
    return reference + timedelta(seconds=interval)


def plus_wall_clock(reference: datetime, interval: float, tz: ZoneInfo) -> datetime:
    """`interval` seconds added to the wall-clock reading of `reference` in `tz`.

    A local time that does not exist (the hour skipped in spring) resolves to the same reading
    after the jump; an ambiguous one (the hour repeated in autumn) to its first occurrence.
    """
    local = reference.astimezone(tz).replace(tzinfo=None) + timedelta(seconds=interval)
    return local.replace(tzinfo=tz).astimezone(UTC)


def fixed_datetime(value: datetime | str | None, tz: ZoneInfo) -> datetime:
    """A fixed date-time; without an offset it is wall-clock time in `tz`."""
    if value is None or value == "":
        raise DefinitionError("fixed_datetime needs a datetime (ISO 8601)")
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise DefinitionError(f"invalid ISO 8601 date-time {value!r}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    return value.astimezone(UTC)


def average_runtime(queued_at: datetime, durations: Iterable[float], *, window: int, min_runs: int) -> datetime | None:
    """`queued_at` plus the mean of the newest `window` durations; None with fewer than `min_runs`.

    A DAG without enough history has no baseline to be late against, so it gets no deadline
    (rather than a guess) until `min_runs` successful runs exist.
    """
    recent = [float(d) for d in durations][: max(window, 0)]
    if len(recent) < max(min_runs, 1):
        return None
    return plus_elapsed(queued_at, statistics.fmean(recent))


def resolve(
    reference: str,
    interval: float,
    facts: Facts,
    *,
    fixed: datetime | str | None = None,
    window: int = 10,
    min_runs: int = 3,
) -> datetime | None:
    """The need-by time of one definition, or None when the reference does not apply yet.

    A missing timestamp (a run not yet queued, a task not yet started) falls back to `now`:
    the engine calls this at the moment the run or task reaches the reference.
    """
    try:
        kind = Reference(reference)
    except ValueError:
        raise DefinitionError(f"unknown reference {reference!r}") from None
    match kind:
        case Reference.DAGRUN_QUEUED_AT:
            return plus_elapsed(facts.queued_at or facts.now, interval)
        case Reference.DAGRUN_LOGICAL_DATE:
            return plus_wall_clock(facts.logical_date or facts.now, interval, facts.tz)
        case Reference.FIXED_DATETIME:
            return plus_elapsed(fixed_datetime(fixed, facts.tz), interval)
        case Reference.AVERAGE_RUNTIME:
            base = average_runtime(
                facts.queued_at or facts.now, facts.recent_run_durations, window=window, min_runs=min_runs
            )
            return None if base is None else plus_elapsed(base, interval)
        case Reference.TASK_QUEUED_AT:
            return plus_elapsed(facts.task_queued_at or facts.now, interval)
        case Reference.TASK_STARTED_AT:
            return plus_elapsed(facts.task_started_at or facts.now, interval)
    raise AssertionError(f"unhandled reference {kind}")  # every Reference member is matched above


def applies_on(logical_date: datetime, tz: ZoneInfo, days: Sequence[str] = (), skip_dates: Sequence[str] = ()) -> bool:
    """Whether a run with this logical date gets the deadline: its local date is one of `days`
    (all days when empty) and not one of `skip_dates` (ISO dates)."""
    local_day = logical_date.astimezone(tz).date()
    if days and WEEKDAYS[local_day.weekday()] not in {d.lower() for d in days}:
        return False
    return local_day not in {_as_date(d) for d in skip_dates}


def _as_date(value: str | date) -> date:
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise DefinitionError(f"skip_dates: invalid ISO date {value!r}") from None
