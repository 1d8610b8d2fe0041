"""Cron schedules in a DAG's timezone (croniter). Pure: callers pass `now`."""
from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}


def expression(schedule: str) -> str:
    return PRESETS.get(schedule.strip(), schedule.strip())


def is_valid(schedule: str) -> bool:
    return croniter.is_valid(expression(schedule))


def next_after(schedule: str, tz_name: str, after: datetime) -> datetime:
    """The first tick strictly after `after`, computed in the DAG's timezone (DST-aware)."""
    local = after.astimezone(ZoneInfo(tz_name))
    return croniter(expression(schedule), local).get_next(datetime).astimezone(ZoneInfo("UTC"))


def first_run_date(schedule: str, tz_name: str, start_date: datetime | None, catchup: bool, now: datetime) -> datetime:
    """The logical date of a DAG's first scheduled run.

    With catchup, runs start at the first tick at or after start_date; without it, at the
    next tick from now (or start_date, if that is later).
    """
    base = start_date or now
    if not catchup and base < now:
        base = now
    # A tick exactly at start_date counts: step back a microsecond before asking for the next one.
    return next_after(schedule, tz_name, base.replace(microsecond=0) - _EPSILON if base == start_date else base)


def latest_due(schedule: str, tz_name: str, due: datetime, now: datetime) -> datetime:
    """Without catchup, skip missed ticks: the latest tick at or before `now`, from `due` on."""
    latest = due
    candidate = next_after(schedule, tz_name, due)
    while candidate <= now:
        latest = candidate
        candidate = next_after(schedule, tz_name, candidate)
    return latest


def ticks_between(schedule: str, tz_name: str, start: datetime, end: datetime, limit: int) -> list[datetime]:
    """Every tick in [start, end], oldest first, in UTC; at most `limit + 1` of them, so that a
    caller can tell "more than `limit`" without walking a huge range."""
    ticks: list[datetime] = []
    tick = next_after(schedule, tz_name, start - _EPSILON)
    while tick <= end and len(ticks) <= limit:
        ticks.append(tick)
        tick = next_after(schedule, tz_name, tick)
    return ticks


_EPSILON = timedelta(microseconds=1)
