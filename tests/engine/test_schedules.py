"""Cron schedules in a DAG's timezone."""
from datetime import datetime, timezone

from orchestrator.engine.schedules import (
    first_run_date,
    is_valid,
    latest_due,
    next_after,
)

UTC = timezone.utc


def test_it_keeps_local_time_across_daylight_saving():
    """A 02:30 Amsterdam cron is 01:30 UTC in winter and 00:30 UTC in summer."""
    winter = next_after("30 2 * * *", "Europe/Amsterdam", datetime(2026, 1, 10, 12, tzinfo=UTC))
    summer = next_after("30 2 * * *", "Europe/Amsterdam", datetime(2026, 7, 10, 12, tzinfo=UTC))
    assert winter == datetime(2026, 1, 11, 1, 30, tzinfo=UTC)
    assert summer == datetime(2026, 7, 11, 0, 30, tzinfo=UTC)


def test_it_accepts_presets_and_rejects_garbage():
    """@daily and friends are valid; a bad cron is not."""
    assert is_valid("@daily")
    assert is_valid("@hourly")
    assert is_valid("*/5 * * * *")
    assert not is_valid("61 * * * *")
    assert not is_valid("every day")


def test_it_starts_at_start_date_with_catchup_and_at_the_next_tick_without():
    """Catchup begins at start_date (inclusive); otherwise at the next tick from now."""
    now = datetime(2026, 3, 5, 10, 15, tzinfo=UTC)
    start = datetime(2026, 3, 1, tzinfo=UTC)
    assert first_run_date("@daily", "UTC", start, True, now) == start
    assert first_run_date("@daily", "UTC", start, False, now) == datetime(2026, 3, 6, tzinfo=UTC)


def test_it_skips_missed_ticks_to_the_latest_due_one():
    """Without catchup only the latest due tick runs."""
    now = datetime(2026, 3, 5, 10, 15, tzinfo=UTC)
    assert latest_due("@hourly", "UTC", datetime(2026, 3, 5, 6, tzinfo=UTC), now) == datetime(2026, 3, 5, 10, tzinfo=UTC)
