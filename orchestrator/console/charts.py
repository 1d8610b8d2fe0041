"""Small server-side SVG charts: geometry computed here, drawn by templates/web/_bits.html."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from deadlines.models import Deadline
from orchestrator.console.text import duration
from orchestrator.models import DagRun
from retries.states import Category

WIDTH = 600
HEIGHT = 80
GAP = 2


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str
    url: str = ""


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    baseline: float
    label: str  # what the chart shows, for screen readers

    @property
    def empty(self) -> bool:
        return not self.bars


def bars(values: Sequence[tuple[float, str, str, str]], label: str, *, baseline_share: float = 1.0) -> Chart:
    """A bar per (value, css class, title, url), scaled to the largest value; equal widths."""
    if not values:
        return Chart(WIDTH, HEIGHT, [], HEIGHT, label)
    top = max(abs(v) for v, *_ in values) or 1.0
    slot = WIDTH / len(values)
    base = HEIGHT * baseline_share
    out = []
    for i, (value, css, title, url) in enumerate(values):
        h = max(2.0, (base - 4) * abs(value) / top) if value else 2.0
        out.append(Bar(round(i * slot + GAP / 2, 1), round(base - h, 1), round(max(slot - GAP, 1), 1), round(h, 1), css, title, url))
    return Chart(WIDTH, HEIGHT, out, base, label)


def deadline_history(runs: Sequence[DagRun]) -> Chart:
    """The DAG-level deadline of each run (oldest first): met in green, missed in red, bar = how late.

    A met deadline is drawn as a short green bar; a missed one as tall as it was late,
    relative to the latest miss. One query for all the runs.
    """
    by_run: dict[int, Deadline] = {}
    for row in Deadline.objects.filter(dag_run__in=[r.pk for r in runs], scope="dag").order_by("need_by", "id"):
        by_run.setdefault(row.dag_run_id, row)
    values: list[tuple[float, str, str, str]] = []
    for run in runs:
        deadline = by_run.get(run.pk)
        if deadline is None:
            continue
        late = deadline.lateness_seconds or 0.0
        if deadline.state == Deadline.State.MISSED:
            values.append((max(late, 1.0), "missed", f"{run.run_id}: missed by {duration(late)}", ""))
        elif deadline.state == Deadline.State.MET:
            values.append((0.0, "met", f"{run.run_id}: met, {duration(-late)} early" if late < 0 else f"{run.run_id}: met", ""))
        else:
            values.append((0.0, "pending", f"{run.run_id}: {deadline.state}", ""))
    return bars(values, "Deadline per run, oldest first: green met, red missed (height: how late)")


# The stacked failures chart: segments bottom-up in this order (the product's central split:
# the platform's failures, the task's own, and time), then anything else.
CATEGORY_ORDER = [Category.INFRASTRUCTURE.value, Category.APPLICATION.value, Category.TIMEOUT.value, Category.USER_ACTION.value]
OTHER = "other"
STACK_HEIGHT = 150  # px: the plot, the axis and its labels
PLOT_TOP = 16  # room for the scale's label
BASELINE = 124  # the time axis; its labels sit below it
MAX_TICKS = 8
TICK_EVERY = {timedelta(minutes=1): (5, 10, 15, 30), timedelta(hours=1): (1, 2, 3, 6, 12), timedelta(days=1): (1, 2, 5, 7, 10)}
TICK_FORMAT = {timedelta(minutes=1): "%H:%M", timedelta(hours=1): "%H:%M", timedelta(days=1): "%b %d"}


@dataclass(frozen=True)
class Segment:
    category: str
    n: int
    y: float
    height: float


@dataclass(frozen=True)
class BucketBar:
    start: datetime
    total: int
    x_percent: float
    width_percent: float
    segments: list[Segment]
    title: str


@dataclass(frozen=True)
class Tick:
    x_percent: float
    label: str
    anchor: str  # start | middle | end: the first and last labels stay inside the chart


@dataclass(frozen=True)
class StackedChart:
    """Every bucket of a window, oldest left; x in percent of the width (the SVG stretches to its
    box while its text keeps its size), y in px."""

    label: str
    bars: list[BucketBar]
    ticks: list[Tick]
    top: int  # the largest bar's total: the scale's one label
    categories: list[str]  # the legend: those drawn, in stacking order
    height: int = STACK_HEIGHT
    plot_top: int = PLOT_TOP
    baseline: int = BASELINE

    @property
    def total(self) -> int:
        return sum(bar.total for bar in self.bars)

    @property
    def plot_height(self) -> int:
        return self.baseline - self.plot_top

    @property
    def axis_label_y(self) -> int:
        return self.baseline + 16

    @property
    def tick_top(self) -> int:
        return self.baseline + 4


def bucket_starts(since: datetime, until: datetime, step: timedelta) -> list[datetime]:
    """The start of every bucket of [since, until], in UTC, truncated like the database does."""
    def trunc(at: datetime) -> datetime:
        at = at.astimezone(dt_timezone.utc)
        if step >= timedelta(days=1):
            return at.replace(hour=0, minute=0, second=0, microsecond=0)
        if step >= timedelta(hours=1):
            return at.replace(minute=0, second=0, microsecond=0)
        return at.replace(second=0, microsecond=0)

    starts, at = [], trunc(since)
    while at <= until:
        starts.append(at)
        at += step
    return starts


def _ticks(starts: list[datetime], step: timedelta, slot: float) -> list[Tick]:
    """Labels on round times, at most MAX_TICKS of them."""
    unit = {timedelta(minutes=1): "minute", timedelta(hours=1): "hour", timedelta(days=1): "day"}[step]
    every = next((n for n in TICK_EVERY[step] if len(starts) / n <= MAX_TICKS), TICK_EVERY[step][-1])
    ticks = []
    for i, at in enumerate(starts):
        value = {"minute": at.minute, "hour": at.hour, "day": at.toordinal()}[unit]
        if value % every:
            continue
        x = round((i + 0.5) * slot, 3)
        anchor = "start" if x < 4 else "end" if x > 96 else "middle"
        ticks.append(Tick(x, at.strftime(TICK_FORMAT[step]), anchor))
    return ticks


def failures_over_time(
    counts: Mapping[tuple[datetime, str], int], *, since: datetime, until: datetime, step: timedelta, fmt: str, window: str
) -> StackedChart:
    """Failed attempts per bucket of the window (`counts`: (bucket start, category) -> n), one bar
    per bucket, empty ones included, stacked by category; a title per bar says what it counts."""
    starts = bucket_starts(since, until, step)
    by_bucket: dict[datetime, dict[str, int]] = {at: {} for at in starts}
    for (at, category), n in counts.items():
        key = category if category in CATEGORY_ORDER else OTHER
        bucket = by_bucket.setdefault(at, {})
        bucket[key] = bucket.get(key, 0) + n
    starts = sorted(by_bucket)
    top = max((sum(c.values()) for c in by_bucket.values()), default=0)
    scale = (BASELINE - PLOT_TOP) / (top or 1)
    slot = 100 / max(len(starts), 1)
    order = [*CATEGORY_ORDER, OTHER]
    bars = []
    for i, at in enumerate(starts):
        found = by_bucket[at]
        y, segments = float(BASELINE), []
        for category in order:
            n = found.get(category, 0)
            if not n:
                continue
            height = max(n * scale, 1.5)
            y -= height
            segments.append(Segment(category, n, round(y, 1), round(height, 1)))
        total = sum(found.values())
        split = ", ".join(f"{found[c]} {c}" for c in order if found.get(c))
        title = f"{at.strftime(fmt)}: {total}" + (f" ({split})" if split else " (no failures)")
        gap = min(slot * 0.15, 0.4)
        bars.append(BucketBar(at, total, round(i * slot + gap / 2, 3), round(slot - gap, 3), segments, title))
    drawn = {s.category for bar in bars for s in bar.segments}
    legend = [c for c in CATEGORY_ORDER[:3]] + [c for c in (Category.USER_ACTION.value, OTHER) if c in drawn]
    label = f"Failed attempts over the last {window}, one bar per {'minute' if step < timedelta(hours=1) else 'hour' if step < timedelta(days=1) else 'day'}, by category"
    return StackedChart(label, bars, _ticks(starts, step, slot), top, legend)
