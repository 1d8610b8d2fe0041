"""Need-by rules (deadlines.references): pure, no database."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deadlines import references
from deadlines.references import Facts, applies_on, resolve

AMS = ZoneInfo("Europe/Amsterdam")
NOW = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)


def facts(**kwargs) -> Facts:
    return Facts(now=kwargs.pop("now", NOW), tz=kwargs.pop("tz", AMS), **kwargs)


def test_it_adds_the_interval_to_the_queued_time():
    """dagrun_queued_at: need-by is the run's queued time plus the interval, in real seconds."""
    queued = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    assert resolve("dagrun_queued_at", 3600, facts(queued_at=queued)) == queued + timedelta(hours=1)


def test_it_falls_back_to_now_when_the_reference_time_is_not_set():
    """A reference reached right now (no stored timestamp yet) counts from `now`."""
    assert resolve("task_started_at", 10, facts()) == NOW + timedelta(seconds=10)
    assert resolve("task_queued_at", 5, facts()) == NOW + timedelta(seconds=5)


def test_it_reads_a_naive_fixed_datetime_in_the_dag_timezone_across_a_dst_change():
    """9 AM Amsterdam is 08:00 UTC before the March clock change and 07:00 UTC after it."""
    before = resolve("fixed_datetime", 0, facts(), fixed="2026-03-28T09:00:00")
    after = resolve("fixed_datetime", 0, facts(), fixed="2026-03-29T09:00:00")
    assert before == datetime(2026, 3, 28, 8, 0, tzinfo=UTC)
    assert after == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)
    assert after.astimezone(AMS).hour == before.astimezone(AMS).hour == 9


def test_it_keeps_an_explicit_offset_of_a_fixed_datetime():
    """A fixed datetime written with an offset means exactly that moment, plus the interval."""
    need_by = resolve("fixed_datetime", 60, facts(), fixed="2026-03-29T09:00:00+00:00")
    assert need_by == datetime(2026, 3, 29, 9, 1, tzinfo=UTC)


def test_it_adds_a_logical_date_interval_on_the_dag_wall_clock():
    """Local midnight + 9 h is 9 AM local on the day clocks spring forward (8 real hours later)."""
    for day in (28, 29, 30):
        midnight = datetime(2026, 3, day, tzinfo=AMS).astimezone(UTC)
        need_by = resolve("dagrun_logical_date", 9 * 3600, facts(logical_date=midnight))
        local = need_by.astimezone(AMS)
        assert (local.day, local.hour, local.minute) == (day, 9, 0)
    dst_day = datetime(2026, 3, 29, tzinfo=AMS)
    assert resolve("dagrun_logical_date", 9 * 3600, facts(logical_date=dst_day)) - dst_day == timedelta(hours=8)


def test_it_means_the_same_reading_after_the_jump_for_a_skipped_local_time():
    """02:30 does not exist in Amsterdam on 2026-03-29: it resolves to 03:30 local."""
    midnight = datetime(2026, 3, 29, tzinfo=AMS)
    need_by = resolve("dagrun_logical_date", 2.5 * 3600, facts(logical_date=midnight)).astimezone(AMS)
    assert (need_by.hour, need_by.minute) == (3, 30)


def test_it_uses_the_mean_of_recent_runs_for_average_runtime():
    """average_runtime: queued time + mean of the newest `window` successful durations + interval."""
    queued = NOW
    need_by = resolve(
        "average_runtime", 5, facts(queued_at=queued, recent_run_durations=[10, 20, 30, 1000]), window=3, min_runs=3
    )
    assert need_by == queued + timedelta(seconds=20 + 5)


def test_it_gives_no_average_runtime_deadline_with_too_few_runs():
    """Fewer than min_runs successful runs: no baseline, so no deadline (None), not a guess."""
    assert resolve("average_runtime", 0, facts(queued_at=NOW, recent_run_durations=[10, 20]), min_runs=3) is None
    assert resolve("average_runtime", 0, facts(queued_at=NOW), min_runs=3) is None


def test_it_rejects_a_fixed_datetime_without_a_value_and_an_unknown_reference():
    """Bad definitions raise DefinitionError naming the problem."""
    with pytest.raises(references.DefinitionError, match="needs a datetime"):
        resolve("fixed_datetime", 0, facts(), fixed=None)
    with pytest.raises(references.DefinitionError, match="invalid ISO 8601"):
        resolve("fixed_datetime", 0, facts(), fixed="next tuesday")
    with pytest.raises(references.DefinitionError, match="unknown reference 'dag_parsed_at'"):
        resolve("dag_parsed_at", 0, facts())


def test_it_applies_only_on_listed_days_in_the_dag_timezone():
    """days is evaluated on the local date: 23:30 UTC Friday is already Saturday in Amsterdam."""
    friday_night_utc = datetime(2026, 3, 27, 23, 30, tzinfo=UTC)
    weekdays = ["mon", "tue", "wed", "thu", "fri"]
    assert applies_on(friday_night_utc, UTC, weekdays)
    assert not applies_on(friday_night_utc, AMS, weekdays)
    assert applies_on(friday_night_utc, AMS, [])


def test_it_skips_listed_dates():
    """skip_dates (ISO dates) exclude runs whose local logical date is one of them."""
    christmas = datetime(2026, 12, 25, 6, 0, tzinfo=UTC)
    assert not applies_on(christmas, AMS, [], ["2026-12-25"])
    assert applies_on(christmas + timedelta(days=1), AMS, [], ["2026-12-25"])
    with pytest.raises(references.DefinitionError, match="skip_dates"):
        applies_on(christmas, AMS, [], ["25/12/2026"])


@given(
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    st.floats(min_value=0, max_value=10 * 86400, allow_nan=False),
)
def test_it_never_puts_a_wall_clock_need_by_more_than_an_hour_away_from_elapsed_time(logical_date, interval):
    """Wall-clock and elapsed arithmetic differ by at most the DST shift (one hour in Amsterdam)."""
    wall = references.plus_wall_clock(logical_date, interval, AMS)
    elapsed = references.plus_elapsed(logical_date, interval)
    assert abs((wall - elapsed).total_seconds()) <= 3600
